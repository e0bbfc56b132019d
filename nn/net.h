// A network as a list of set-up layer nodes over numbered tensors, run forward and backward on
// one backend, with parameters in one flat arena and gradients reported ready in backward order.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/arena.h"
#include "nn/ops.h"

namespace rt {

template <class T>
class Net;

// One layer in the graph. Implementations live in nn/net_nodes.h.
template <class T>
class Node {
 public:
  virtual ~Node() = default;
  virtual void forward(Net<T>& net, bool train) = 0;
  virtual void backward(Net<T>& net) = 0;
  std::string name;
  std::vector<int> inputs;  // tensor ids
  int output = -1;
  std::vector<int> params;  // arena ids, in registration order
  double flops = 0;         // forward multiply-adds x 2
  // What backward reads besides gradients: tensors nobody reads in backward live only in forward
  // and share memory with others (PyTorch frees them the same way). keeps_inputs counts inputs
  // from the first.
  int keeps_inputs = 0;
  bool keeps_output = false;
};

template <class T>
class Net {
 public:
  // input: the logical NCHW shape of one batch.
  Net(std::unique_ptr<Backend<T>> backend, Shape input);
  ~Net();

  // --- building (returns the output tensor id) ---
  int input() const { return 0; }
  int conv(int x, const std::string& name, int64_t out_c, int64_t kernel, int64_t stride,
           int64_t pad, bool bias = false, int64_t groups = 1);
  int conv(int x, ConvDesc desc);  // any geometry; desc.in is filled from x
  int batchnorm(int x, const std::string& name, bool relu, double momentum = 0.1, double eps = 1e-5);
  // Batch norms built after this take their training statistics over sync's group of ranks
  // (BatchNormDesc::sync); null: over this rank's batch. The net keeps sync alive.
  void set_bn_sync(std::shared_ptr<BnSync> sync) { bn_sync_ = std::move(sync); }
  int relu(int x, const std::string& name);
  int maxpool(int x, const std::string& name, int64_t kernel, int64_t stride, int64_t pad);
  int global_avgpool(int x, const std::string& name);
  // Windowed average pooling (AvgPoolDesc: ceil_mode, padding not counted): ResNet-D's shortcut.
  int avgpool(int x, const std::string& name, int64_t kernel, int64_t stride, int64_t pad, bool ceil_mode);
  int linear(int x, const std::string& name, int64_t out_features, bool bias = true);
  int add(int a, int b, const std::string& name, bool relu);
  int pad_shortcut(int x, const std::string& name, int64_t out_c, int64_t stride);
  // y = x * sigmoid(g), g of shape (n, c, 1, 1): squeeze-and-excitation's gate on x's channels.
  int channel_gate(int x, int g, const std::string& name);
  // ECA's 1-D convolution across the channels of an (n, c, 1, 1) tensor (ChannelConvDesc), its
  // weight name + ".weight" of shape (1, 1, kernel) as PyTorch's Conv1d(1, 1, kernel) holds it.
  int channel_conv(int x, const std::string& name, int64_t kernel);
  // Stochastic depth on a residual branch x: in training each sample's x is dropped with
  // probability rate, else scaled by 1 / (1 - rate); evaluation passes x as it is.
  int drop_path(int x, const std::string& name, double rate);
  // Marks `logits` as the output and adds the loss (softmax cross-entropy or BCE; nn/ops.h).
  void loss(int logits, const LossSpec& spec);
  // Before finalize(): the network will only run forward (evaluation), so no activation is kept
  // for backward and all share memory as they die; backward() throws.
  void set_inference_only();
  // Lays out the arena and plans memory; no building after this.
  void finalize();

  // --- running ---
  // Imports the NCHW batch and runs all layers, the loss too when there are labels; returns the
  // mean loss (0 without labels): queue_forward(), then last_loss().
  double forward(const T* input_nchw, const Targets& targets, bool train);
  // The same from 8-bit pixels (NHWC RGB, the loader's Output::u8), normalized with `norm` by the
  // backend's act_import_u8: equal to forward() on the loader's float output.
  double forward_u8(const uint8_t* pixels_nhwc, const NormParams& norm, const Targets& targets, bool train);
  // forward() without reading the loss: on a device backend nothing waits, so backward can be
  // queued behind forward with no gap on the device. Read the loss later with last_loss().
  void queue_forward(const T* input_nchw, const Targets& targets, bool train);
  void queue_forward_u8(const uint8_t* pixels_nhwc, const NormParams& norm, const Targets& targets, bool train);
  // The mean loss of the last forward (0 without labels); a device backend waits for it here.
  double last_loss();
  // Gradients of the mean loss (times loss_scale) into the arena's gradient buffer. After each
  // layer, on_ready(n) reports that grads()[0, n) is final (n grows monotonically to size()):
  // final for the host (the backend synced first), or, with set_ready_sync(false), final in the
  // backend's queue order (Backend::stream()), for a consumer that fences on that queue itself.
  // addend (arena-sized, in arena memory, zero in the alignment padding like grads(); nullptr:
  // none): grads() += addend, each range before it is reported, so that what on_ready reports
  // already holds the gradients of earlier passes.
  void backward(const std::function<void(size_t)>& on_ready = {}, double loss_scale = 1.0,
                const T* addend = nullptr);
  void set_ready_sync(bool sync) { ready_sync_ = sync; }
  // What the random draws of training forwards (drop_path's masks) are a function of, with the
  // node and sample: the trainer sets it per pass from the seed, step, pass and rank.
  void set_noise_key(uint64_t key) { noise_key_ = key; }
  uint64_t noise_key() const { return noise_key_; }
  // Nodes before `first` run no backward: a frozen stem (fine-tuning), where none of them has a
  // parameter to train, so no gradient they would compute is used (PyTorch's autograd stops there
  // the same way). Their parameters' gradients in grads() are left as they are. 0: every node.
  void set_backward_from(size_t first);
  size_t backward_from() const { return backward_from_; }
  // Batch norm node `node` (one before backward_from(): its backward, which would need the
  // batch's statistics, never runs) normalizes with its running statistics in training too and
  // leaves them as they are: PyTorch's .eval() on a frozen module. Throws rt::Error naming the
  // layer otherwise.
  void freeze_statistics(size_t node);
  // The first node with a parameter that `trains` accepts (num_nodes() if none): the latest
  // set_backward_from that still computes every such parameter's gradient.
  size_t first_node_training(const std::function<bool(const ParamInfo&)>& trains) const;
  // Copies a tensor out in NCHW after forward(). Only tensors kept for backward (and the logits)
  // hold their values after forward(): one that backward does not read (e.g. a BN output feeding
  // only a residual add) shares memory with a later tensor of the same forward, which may
  // overwrite it.
  void export_tensor(int id, T* nchw) const;
  // The same, queued (Backend::act_export_queued): nchw holds the tensor after the backend's
  // next sync(), and a tensor that backward overwrites may be exported just before it.
  void export_tensor_queued(int id, T* nchw) const;
  int logits() const { return logits_; }
  // Diagnosis after a non-finite loss or gradient: runs forward again in training mode, as the
  // step did, node by node, and returns the first node whose output holds a non-finite value
  // (the loss node when only the loss does), kNonFiniteInput when the input as imported already
  // holds one, or -1 when all stays finite. Allocates; not for the step itself.
  static constexpr int kNonFiniteInput = -2;
  int first_nonfinite_node(const T* input_nchw, const Targets& targets);
  int first_nonfinite_node_u8(const uint8_t* pixels_nhwc, const NormParams& norm, const Targets& targets);

  // --- access ---
  Arena<T>& arena() { return arena_; }
  const Arena<T>& arena() const { return arena_; }
  Backend<T>& backend() { return *backend_; }
  const Shape& shape(int id) const { return shapes_[id]; }
  T* act(int id) { return act_ptr_[id]; }
  const Targets& targets() const { return targets_; }
  size_t num_nodes() const { return nodes_.size(); }
  const Node<T>& node(size_t i) const { return *nodes_[i]; }
  // FLOPs of one training step (forward, backward-data, backward-weights of conv and linear).
  double train_flops() const;
  double forward_flops() const;
  // Per-node wall time, accumulated over forward and backward calls while profiling is on. A
  // device backend is synced around each node so that the time is the node's work on the device;
  // profiled steps run slower.
  void set_profiling(bool on) { profiling_ = on; }
  struct NodeTime {
    double forward_s = 0, backward_s = 0;
    int64_t calls = 0;
  };
  const std::vector<NodeTime>& node_times() const { return node_times_; }
  // Bytes held for activations and gradient buffers after finalize().
  size_t activation_bytes() const;

  // Used by nodes during backward. grad_target(id): where to write tensor id's gradient (a
  // second consumer's contribution goes to scratch and is summed in grad_done). grad_alias: the
  // node's gradient for input id equals the one held for tensor `from` (no copy when possible).
  T* grad_target(int id);
  void grad_done(int id);
  // Tensor id's gradient so far (unshared first), for a consumer that adds its share in place
  // (ConvOp::adds_dx); null while it has none.
  T* grad_to_add(int id);
  void grad_alias(int id, int from);
  // The final gradient of tensor id, for its producer.
  T* grad_of(int id) { return slots_[grad_slot_[id]].buf.data(); }
  bool needs_grad(int id) const { return id != 0; }
  int add_param_(const std::string& name, std::vector<int64_t> dims, ParamKind kind) {
    return arena_.add_param(name, std::move(dims), kind);
  }
  int add_state_(const std::string& name, size_t n, T init) { return arena_.add_state(name, n, init); }
  double loss_scale() const { return loss_scale_; }

 private:
  void fuse_bn_add();  // finalize(), where the backend fuses_bn_add()
  void run_forward(const Targets& targets, bool train);  // on the imported input
  double profile_clock() const;
  int run_nonfinite_search(const Targets& targets);
  int push(std::unique_ptr<Node<T>> node, const Shape& out);
  int slot_alloc(size_t elems);
  void plan_activations();
  void slot_release(int slot);
  int slot_unshare(int id);
  void check_building(const std::string& what) const;

  std::shared_ptr<BnSync> bn_sync_;  // declared before nodes_: outlives the ops pointing to it
  std::unique_ptr<Backend<T>> backend_;
  Arena<T> arena_;
  std::vector<Shape> shapes_;
  std::vector<Buffer<T>> acts_;  // tensors backward reads (empty for forward-only tensors)
  std::vector<T*> act_ptr_;      // every tensor: its own buffer, or a shared slot
  std::vector<std::unique_ptr<Node<T>>> nodes_;
  std::vector<size_t> ready_after_;  // grads()[0, ready_after_[i]) final after node i's backward
  int logits_ = -1;
  bool finalized_ = false;
  Targets targets_;
  double loss_scale_ = 1.0;
  SoftmaxXentOp<T>* loss_op_ = nullptr;  // the loss node's
  bool ready_sync_ = true;  // backend_->sync() before each on_ready report
  uint64_t noise_key_ = 0;
  bool inference_only_ = false;
  size_t backward_from_ = 0;  // nodes before it skip backward
  size_t frozen_stats_end_ = 0;  // after the last node with frozen statistics
  bool profiling_ = false;
  std::vector<NodeTime> node_times_;

  // Gradient buffers are slots reused across tensors whose gradients are not alive at the same
  // time. Backward runs the same sequence every step, so after the first step the slots exist
  // and are handed out identically: no allocation in the step.
  struct Slot {
    explicit Slot(const MemorySpace* space) : buf(space) {}
    Buffer<T> buf;
    int refs = 0;
  };
  std::vector<Slot> slots_;
  std::vector<int> free_slots_;
  std::vector<int> grad_slot_;     // tensor -> slot holding its gradient (-1: none yet)
  std::vector<int> scratch_slot_;  // tensor -> slot holding a second contribution (-1: none)
};

}  // namespace rt
