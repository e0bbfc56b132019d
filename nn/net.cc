// Graph building: nodes (nn/net_nodes.h), the batch norm + add fusion, the gradient-ready
// offsets, the activation memory plan, FLOP and byte accounting. Running it: nn/net_run.cc.
#include "nn/net.h"

#include <algorithm>

#include "nn/net_nodes.h"

namespace rt {
using namespace detail;

template <class T>
Net<T>::Net(std::unique_ptr<Backend<T>> backend, Shape input) : backend_(std::move(backend)) {
  RT_SHAPE_CHECK(input.numel() > 0, "network input shape ", input.str(), " is empty");
  shapes_.push_back(input);
  arena_.set_memory(backend_->param_memory());
}

template <class T>
Net<T>::~Net() = default;

template <class T>
void Net<T>::check_building(const std::string& what) const {
  if (finalized_) throw Error("cannot add layer " + what + " after the network is finalized");
}

template <class T>
int Net<T>::push(std::unique_ptr<Node<T>> node, const Shape& out) {
  for (int x : node->inputs)
    RT_SHAPE_CHECK(x >= 0 && x < int(shapes_.size()), "layer ", node->name, ": unknown input tensor ", x);
  shapes_.push_back(out);
  node->output = int(shapes_.size()) - 1;
  nodes_.push_back(std::move(node));
  return int(shapes_.size()) - 1;
}

template <class T>
int Net<T>::conv(int x, const std::string& name, int64_t out_c, int64_t kernel, int64_t stride,
                 int64_t pad, bool bias, int64_t groups) {
  ConvDesc d;
  d.name = name;
  d.out_c = out_c;
  d.kernel_h = d.kernel_w = kernel;
  d.stride_h = d.stride_w = stride;
  d.pad_h = d.pad_w = pad;
  d.bias = bias;
  d.groups = groups;
  return conv(x, d);
}

template <class T>
int Net<T>::conv(int x, ConvDesc d) {
  check_building(d.name);
  d.in = shapes_.at(x);
  d.input_grad = needs_grad(x);
  auto n = std::make_unique<WeightedNode<T, ConvOp<T>>>();
  n->op = backend_->make_conv(d);
  n->bias = d.bias;
  n->keeps_inputs = 1;
  n->name = d.name;
  n->inputs = {x};
  n->params.push_back(add_param_(d.name + ".weight", {d.out_c, d.in_per_group(), d.kernel_h, d.kernel_w},
                                 ParamKind::conv_weight));
  if (d.bias) n->params.push_back(add_param_(d.name + ".bias", {d.out_c}, ParamKind::bias));
  Shape o = d.out();
  n->flops = 2.0 * double(o.numel()) * double(d.in_per_group() * d.kernel_h * d.kernel_w);
  return push(std::move(n), o);
}

template <class T>
int Net<T>::batchnorm(int x, const std::string& name, bool relu, double momentum, double eps) {
  check_building(name);
  BatchNormDesc d{.name = name, .in = shapes_.at(x), .eps = eps, .momentum = momentum, .relu = relu,
                  .sync = bn_sync_.get()};
  auto n = std::make_unique<BatchNormNode<T>>();
  n->op = backend_->make_batchnorm(d);
  n->desc = d;
  n->name = name;
  n->keeps_inputs = 1;
  n->keeps_output = relu && n->op->backward_reads_y();  // the ReLU mask
  n->inputs = {x};
  n->params.push_back(add_param_(name + ".weight", {d.in.c}, ParamKind::bn_gamma));
  n->params.push_back(add_param_(name + ".bias", {d.in.c}, ParamKind::bn_beta));
  n->running_mean = add_state_(name + ".running_mean", size_t(d.in.c), T(0));
  n->running_var = add_state_(name + ".running_var", size_t(d.in.c), T(1));
  return push(std::move(n), d.in);
}

template <class T>
int Net<T>::relu(int x, const std::string& name) {
  check_building(name);
  auto n = std::make_unique<ReluNode<T>>();
  n->op = backend_->make_relu({name, shapes_.at(x)});
  n->name = name;
  n->keeps_output = true;
  n->inputs = {x};
  return push(std::move(n), shapes_[x]);
}

template <class T>
int Net<T>::maxpool(int x, const std::string& name, int64_t kernel, int64_t stride, int64_t pad) {
  check_building(name);
  MaxPoolDesc d{name, shapes_.at(x), kernel, stride, pad};
  auto n = std::make_unique<MaxPoolNode<T>>();
  n->op = backend_->make_maxpool(d);
  n->name = name;
  n->keeps_output = n->op->backward_reads_xy();
  n->keeps_inputs = n->keeps_output ? 1 : 0;
  n->inputs = {x};
  return push(std::move(n), d.out());
}

template <class T>
int Net<T>::avgpool(int x, const std::string& name, int64_t kernel, int64_t stride, int64_t pad, bool ceil_mode) {
  check_building(name);
  AvgPoolDesc d{name, shapes_.at(x), kernel, stride, pad, ceil_mode};
  d.validate();  // out() is only meaningful for a valid geometry, whichever backend checks it
  auto n = std::make_unique<GradOnlyNode<T, AvgPoolOp<T>>>();
  n->op = backend_->make_avgpool(d);
  n->name = name;
  n->inputs = {x};
  return push(std::move(n), d.out());
}

template <class T>
int Net<T>::global_avgpool(int x, const std::string& name) {
  check_building(name);
  GlobalAvgPoolDesc d{name, shapes_.at(x)};
  auto n = std::make_unique<GradOnlyNode<T, GlobalAvgPoolOp<T>>>();
  n->op = backend_->make_global_avgpool(d);
  n->name = name;
  n->inputs = {x};
  return push(std::move(n), d.out());
}

template <class T>
int Net<T>::linear(int x, const std::string& name, int64_t out_features, bool bias) {
  check_building(name);
  LinearDesc d{name, shapes_.at(x), out_features, bias};
  auto n = std::make_unique<WeightedNode<T, LinearOp<T>>>();
  n->op = backend_->make_linear(d);
  n->bias = bias;
  n->keeps_inputs = 1;
  n->name = name;
  n->inputs = {x};
  n->params.push_back(add_param_(name + ".weight", {out_features, d.in.chw()}, ParamKind::linear_weight));
  if (bias) n->params.push_back(add_param_(name + ".bias", {out_features}, ParamKind::bias));
  n->flops = 2.0 * double(d.in.n) * double(out_features) * double(d.in.chw());
  return push(std::move(n), d.out());
}

template <class T>
int Net<T>::add(int a, int b, const std::string& name, bool relu) {
  check_building(name);
  RT_SHAPE_CHECK(shapes_.at(a) == shapes_.at(b), "layer ", name, ": residual add of different shapes ",
                 shapes_[a].str(), " and ", shapes_[b].str());
  auto n = std::make_unique<AddNode<T>>();
  n->op = backend_->make_add({name, shapes_[a], relu});
  n->relu = relu;
  n->name = name;
  n->keeps_output = relu;
  n->inputs = {a, b};
  return push(std::move(n), shapes_[a]);
}

template <class T>
int Net<T>::drop_path(int x, const std::string& name, double rate) {
  check_building(name);
  RT_SHAPE_CHECK(rate >= 0 && rate < 1, "layer ", name, ": drop path rate must be in [0, 1), got ", rate);
  DropPathDesc d{name, shapes_.at(x)};
  auto n = std::make_unique<DropPathNode<T>>();
  n->op = backend_->make_drop_path(d);
  n->rate = rate;
  n->salt = uint64_t(nodes_.size());
  n->scales.assign(size_t(d.in.n), 1.0f);
  n->name = name;
  n->inputs = {x};
  return push(std::move(n), d.in);
}

template <class T>
int Net<T>::channel_gate(int x, int g, const std::string& name) {
  check_building(name);
  ChannelGateDesc d{name, shapes_.at(x)};
  RT_SHAPE_CHECK(shapes_.at(g) == d.gate(), "layer ", name, ": the gate of ", d.in.str(), " must be ",
                 d.gate().str(), ", got ", shapes_[g].str());
  auto n = std::make_unique<ChannelGateNode<T>>();
  n->op = backend_->make_channel_gate(d);
  n->name = name;
  n->inputs = {x, g};
  n->keeps_inputs = 2;
  return push(std::move(n), d.in);
}

template <class T>
int Net<T>::channel_conv(int x, const std::string& name, int64_t kernel) {
  check_building(name);
  ChannelConvDesc d{name, shapes_.at(x), kernel};
  d.validate();
  auto n = std::make_unique<WeightedNode<T, ChannelConvOp<T>>>();
  n->op = backend_->make_channel_conv(d);
  n->name = name;
  n->keeps_inputs = 1;
  n->inputs = {x};
  n->params.push_back(add_param_(name + ".weight", {1, 1, kernel}, ParamKind::conv_weight));
  n->flops = 2.0 * double(d.in.numel()) * double(kernel);
  return push(std::move(n), d.in);
}

template <class T>
int Net<T>::pad_shortcut(int x, const std::string& name, int64_t out_c, int64_t stride) {
  check_building(name);
  PadShortcutDesc d{name, shapes_.at(x), out_c, stride};
  auto n = std::make_unique<GradOnlyNode<T, PadShortcutOp<T>>>();
  n->op = backend_->make_pad_shortcut(d);
  n->name = name;
  n->inputs = {x};
  return push(std::move(n), d.out());
}

template <class T>
void Net<T>::loss(int logits, const LossSpec& spec) {
  check_building("loss");
  SoftmaxXentDesc d{"loss", shapes_.at(logits), spec};
  auto n = std::make_unique<LossNode<T>>();
  n->op = backend_->make_softmax_xent(d);
  n->name = "loss";
  n->inputs = {logits};
  logits_ = logits;
  loss_op_ = n->op.get();
  nodes_.push_back(std::move(n));  // produces no tensor
}

// Each batch norm without ReLU whose output only a residual add reads, as its first input (a
// ResNet branch's last batch norm), becomes one BnAddNode at the add's place (the residual may be
// computed after the batch norm, as a projection shortcut is); the batch norm's output tensor is
// then never written. Parameters keep their registration (and so the arena's layout and
// checkpoints are the same whether a backend fuses or not).
template <class T>
void Net<T>::fuse_bn_add() {
  std::vector<int> readers(shapes_.size(), 0), producer(shapes_.size(), -1);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    for (int x : nodes_[i]->inputs) ++readers[size_t(x)];
    if (nodes_[i]->output >= 0) producer[size_t(nodes_[i]->output)] = int(i);
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    auto* add = dynamic_cast<AddNode<T>*>(nodes_[i].get());
    if (!add) continue;
    const int z = add->inputs[0], p = producer[size_t(z)];
    auto* bn = p >= 0 ? dynamic_cast<BatchNormNode<T>*>(nodes_[size_t(p)].get()) : nullptr;
    if (!bn || bn->desc.relu || readers[size_t(z)] != 1 || z == logits_) continue;
    BatchNormDesc d = bn->desc;
    d.residual = true;
    d.relu = add->relu;
    auto f = std::make_unique<BnAddNode<T>>();
    f->bn = backend_->make_batchnorm(d);
    f->add = std::move(add->op);
    f->running_mean = bn->running_mean;
    f->running_var = bn->running_var;
    f->name = bn->name + "+add";
    f->inputs = {bn->inputs[0], add->inputs[1]};
    f->output = add->output;
    f->params = bn->params;
    f->keeps_inputs = 1;  // x, for the batch norm's backward; not the residual
    f->keeps_output = add->keeps_output;
    nodes_[i] = std::move(f);
    nodes_[size_t(p)].reset();
  }
  nodes_.erase(std::remove(nodes_.begin(), nodes_.end(), nullptr), nodes_.end());
}

template <class T>
void Net<T>::finalize() {
  if (finalized_) return;
  if (logits_ < 0) throw Error("network has no loss: call loss(logits, smoothing) before finalize()");
  if (backend_->fuses_bn_add()) fuse_bn_add();
  arena_.finalize();
  plan_activations();
  // Nodes run backward in reverse; their parameters were registered in forward order and laid
  // out reversed. After node i, the gradients final for the reducer are the longest prefix of the
  // buffer whose parameters' nodes (i and later) are done: usually up to node i's last parameter,
  // but a fused node runs later than its parameters' place (the padding between parameters is
  // never written, so it is as good as done).
  std::vector<std::pair<size_t, size_t>> regions;  // [offset, end) of each parameter, by offset
  std::vector<size_t> node_of;
  for (size_t i = 0; i < nodes_.size(); ++i)
    for (int p : nodes_[i]->params) {
      const ParamInfo& pi = arena_.info(p);
      regions.push_back({pi.offset, pi.offset + pi.count});
      node_of.push_back(i);
    }
  std::vector<size_t> order(regions.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return regions[a] < regions[b]; });
  ready_after_.assign(nodes_.size(), 0);
  constexpr size_t align = 64 / sizeof(T);
  size_t done = 0;  // regions, in offset order, whose node has run backward
  for (size_t i = nodes_.size(); i-- > 0;) {
    while (done < order.size() && node_of[order[done]] >= i) ++done;
    const size_t end = done ? regions[order[done - 1]].second : 0;
    ready_after_[i] = std::min(arena_.size(), (end + align - 1) / align * align);
  }
  grad_slot_.assign(shapes_.size(), -1);
  scratch_slot_.assign(shapes_.size(), -1);
  finalized_ = true;
}

template <class T>
void Net<T>::set_inference_only() {
  check_building("set_inference_only");
  inference_only_ = true;
}

template <class T>
void Net<T>::plan_activations() {
  const size_t nt = shapes_.size();
  std::vector<char> kept(nt, 0);
  std::vector<int> last_use(nt, -1);
  kept[0] = kept[size_t(logits_)] = 1;  // imported input; logits exported after forward
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node<T>& n = *nodes_[i];
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const int x = n.inputs[k];
      kept[x] |= !inference_only_ && int(k) < n.keeps_inputs;
      last_use[x] = int(i);
    }
    if (n.output >= 0) kept[n.output] |= !inference_only_ && n.keeps_output;
  }
  // A layer whose output nobody reads has no gradient to run backward with: a graph built wrong.
  for (const auto& n : nodes_)
    if (n->output >= 0 && n->output != logits_ && last_use[size_t(n->output)] < 0)
      throw Error(str_cat("network: the output of layer '", n->name, "' is read by no other layer"));
  acts_.clear();
  for (size_t t = 0; t < nt; ++t) acts_.emplace_back(backend_->act_memory());
  act_ptr_.assign(nt, nullptr);
  for (size_t t = 0; t < nt; ++t)
    if (kept[t]) {
      acts_[t].resize(backend_->act_size(shapes_[t]));
      act_ptr_[t] = acts_[t].data();
    }
  // Forward-only tensors borrow gradient slots: slots hold gradients only during backward, and
  // these tensors are dead by then. Walk forward once, taking a slot when a tensor is produced
  // and returning it after its last reader.
  std::vector<int> slot_of(nt, -1);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node<T>& n = *nodes_[i];
    int o = n.output;
    if (o >= 0 && !kept[o]) {
      slot_of[o] = slot_alloc(backend_->act_size(shapes_[o]));
      act_ptr_[o] = slots_[slot_of[o]].buf.data();
    }
    for (int x : n.inputs)
      if (!kept[x] && last_use[x] == int(i)) slot_release(slot_of[x]);
  }
}

template <class T>
double Net<T>::forward_flops() const {
  double f = 0;
  for (auto& n : nodes_) f += n->flops;
  return f;
}

template <class T>
double Net<T>::train_flops() const {
  // Backward costs the forward's FLOPs twice (data and weights), except where no input gradient
  // is needed (the stem convolution).
  double f = 0;
  for (auto& n : nodes_) f += n->flops * (needs_grad(n->inputs[0]) ? 3.0 : 2.0);
  return f;
}

template <class T>
size_t Net<T>::activation_bytes() const {
  size_t b = 0;
  for (auto& a : acts_) b += a.size() * sizeof(T);
  for (auto& s : slots_) b += s.buf.size() * sizeof(T);
  return b;
}

template class Net<float>;
template class Net<double>;

}  // namespace rt
