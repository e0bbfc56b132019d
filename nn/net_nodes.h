// The node types nn/net.cc builds: each wraps a backend op and knows which tensors, parameters and
// gradients it reads and writes. Internal to nn/net.cc and nn/net_run.cc.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "nn/hash.h"
#include "nn/net.h"

namespace rt::detail {

// A layer with a weight and an optional bias (convolution, fully connected): both op interfaces
// take (x, w, b) forward and (x, w, dy) -> (dx, dw, db) backward.
template <class T, class Op>
class WeightedNode : public Node<T> {
 public:
  std::unique_ptr<Op> op;
  bool bias = false;
  void forward(Net<T>& net, bool) override {
    auto& a = net.arena();
    op->forward(net.act(this->inputs[0]), a.param(this->params[0]),
                bias ? a.param(this->params[1]) : nullptr, net.act(this->output));
  }
  void backward(Net<T>& net) override {
    auto& a = net.arena();
    int x = this->inputs[0];
    T* dw = a.grad(this->params[0]);
    T* db = bias ? a.grad(this->params[1]) : nullptr;
    // x's other consumer's gradient is there already: added to in place where the op can
    // (convolutions: ConvOp::adds_dx).
    if constexpr (requires(Op& o) { o.adds_dx(); }) {
      if (net.needs_grad(x) && op->adds_dx())
        if (T* sum = net.grad_to_add(x)) {
          op->backward_add_dx(net.act(x), a.param(this->params[0]), net.grad_of(this->output),
                              sum, dw, db);
          return;
        }
    }
    T* dx = net.needs_grad(x) ? net.grad_target(x) : nullptr;
    op->backward(net.act(x), a.param(this->params[0]), net.grad_of(this->output), dx, dw, db);
    if (dx) net.grad_done(x);
  }
};

template <class T>
class BatchNormNode : public Node<T> {
 public:
  std::unique_ptr<BatchNormOp<T>> op;
  BatchNormDesc desc;  // what op was made from
  int running_mean = -1, running_var = -1;
  bool frozen_stats = false;  // Net::freeze_statistics: inference mode in training too
  void forward(Net<T>& net, bool train) override {
    auto& a = net.arena();
    const T* x = net.act(this->inputs[0]);
    T* y = net.act(this->output);
    if (train && !frozen_stats) {
      op->forward_train(x, a.param(this->params[0]), a.param(this->params[1]), y,
                        a.state_ptr(running_mean), a.state_ptr(running_var));
    } else {
      op->forward_eval(x, a.param(this->params[0]), a.param(this->params[1]),
                       a.state_ptr(running_mean), a.state_ptr(running_var), y);
    }
  }
  void backward(Net<T>& net) override {
    auto& a = net.arena();
    int x = this->inputs[0];
    op->backward(net.act(x), a.param(this->params[0]),
                 this->keeps_output ? net.act(this->output) : nullptr,  // else maybe reused
                 net.grad_of(this->output), net.grad_target(x), a.grad(this->params[0]),
                 a.grad(this->params[1]));
    net.grad_done(x);
  }
};

template <class T>
class ReluNode : public Node<T> {
 public:
  std::unique_ptr<ReluOp<T>> op;
  void forward(Net<T>& net, bool) override { op->forward(net.act(this->inputs[0]), net.act(this->output)); }
  void backward(Net<T>& net) override {
    int x = this->inputs[0];
    op->backward(net.act(this->output), net.grad_of(this->output), net.grad_target(x));
    net.grad_done(x);
  }
};

template <class T>
class MaxPoolNode : public Node<T> {
 public:
  std::unique_ptr<MaxPoolOp<T>> op;
  void forward(Net<T>& net, bool train) override {
    op->forward(net.act(this->inputs[0]), net.act(this->output), train);
  }
  void backward(Net<T>& net) override {
    int x = this->inputs[0];
    // What it did not keep (backward_reads_xy false) may have been reused: null.
    op->backward(this->keeps_inputs ? net.act(x) : nullptr, this->keeps_output ? net.act(this->output) : nullptr,
                 net.grad_of(this->output), net.grad_target(x));
    net.grad_done(x);
  }
};

// A layer whose backward needs only its output's gradient (global average pooling, the padded
// shortcut): forward(x, y), backward(dy, dx).
template <class T, class Op>
class GradOnlyNode : public Node<T> {
 public:
  std::unique_ptr<Op> op;
  void forward(Net<T>& net, bool) override { op->forward(net.act(this->inputs[0]), net.act(this->output)); }
  void backward(Net<T>& net) override {
    int x = this->inputs[0];
    op->backward(net.grad_of(this->output), net.grad_target(x));
    net.grad_done(x);
  }
};

template <class T>
class AddNode : public Node<T> {
 public:
  std::unique_ptr<AddOp<T>> op;
  bool relu = false;
  void forward(Net<T>& net, bool) override {
    op->forward(net.act(this->inputs[0]), net.act(this->inputs[1]), net.act(this->output));
  }
  void backward(Net<T>& net) override {
    // In place: the ReLU-masked gradient overwrites the output's gradient, which both inputs share
    // (unshared first where another tensor's gradient still is that buffer: a graph where an
    // add's output and an earlier tensor meet again).
    T* g = relu ? net.grad_to_add(this->output) : net.grad_of(this->output);
    op->backward(net.act(this->output), g, g);
    for (int x : this->inputs) net.grad_alias(x, this->output);
  }
};

// A batch norm whose only reader was a residual add, as one node (Backend::fuses_bn_add):
// inputs {x, r}, y = relu?(bn(x) + r) in one pass. Backward as the two nodes did: the add's
// (in place, ReLU mask from y), whose result is both r's gradient and bn(x)'s, then the batch
// norm's; or, where the op masks_add_relu(), both in its backward_add_relu (the same result, one
// pass over the gradient fewer).
template <class T>
class BnAddNode : public Node<T> {
 public:
  std::unique_ptr<BatchNormOp<T>> bn;
  std::unique_ptr<AddOp<T>> add;
  int running_mean = -1, running_var = -1;
  bool frozen_stats = false;
  void forward(Net<T>& net, bool train) override {
    auto& a = net.arena();
    const T* x = net.act(this->inputs[0]);
    const T* r = net.act(this->inputs[1]);
    T* y = net.act(this->output);
    if (train && !frozen_stats)
      bn->forward_train_add(x, r, a.param(this->params[0]), a.param(this->params[1]), y,
                            a.state_ptr(running_mean), a.state_ptr(running_var));
    else
      bn->forward_eval_add(x, r, a.param(this->params[0]), a.param(this->params[1]),
                           a.state_ptr(running_mean), a.state_ptr(running_var), y);
  }
  void backward(Net<T>& net) override {
    auto& a = net.arena();
    T* g = net.grad_to_add(this->output);  // masked in place: unshared first, as AddNode's
    const int x = this->inputs[0];
    const T* gamma = a.param(this->params[0]);
    if (bn->masks_add_relu()) {
      bn->backward_add_relu(net.act(x), gamma, net.act(this->output), g, net.grad_target(x),
                            a.grad(this->params[0]), a.grad(this->params[1]));
    } else {
      add->backward(net.act(this->output), g, g);
      bn->backward(net.act(x), gamma, nullptr, g, net.grad_target(x), a.grad(this->params[0]),
                   a.grad(this->params[1]));
    }
    net.grad_done(x);
    net.grad_alias(this->inputs[1], this->output);
  }
};

// Squeeze-and-excitation's gate: inputs {x, g}, y = x * sigmoid(g); backward reads both.
template <class T>
class ChannelGateNode : public Node<T> {
 public:
  std::unique_ptr<ChannelGateOp<T>> op;
  void forward(Net<T>& net, bool) override {
    op->forward(net.act(this->inputs[0]), net.act(this->inputs[1]), net.act(this->output));
  }
  void backward(Net<T>& net) override {
    const int x = this->inputs[0], g = this->inputs[1];
    op->backward(net.act(x), net.act(g), net.grad_of(this->output), net.grad_target(x), net.grad_target(g));
    net.grad_done(x);
    net.grad_done(g);
  }
};

// Stochastic depth: in a training forward each sample keeps the branch with probability 1 - rate
// (scaled by 1 / (1 - rate)) or drops it, by a draw that is a function of the net's noise key,
// this node and the sample alone: the same key, the same masks (a resumed run draws them again).
template <class T>
class DropPathNode : public Node<T> {
 public:
  std::unique_ptr<DropPathOp<T>> op;
  double rate = 0;
  uint64_t salt = 0;            // this node's, from its position in the network
  std::vector<float> scales;    // the last training forward's
  void forward(Net<T>& net, bool train) override {
    if (!train) return op->forward(net.act(this->inputs[0]), nullptr, net.act(this->output));
    const double keep = 1.0 - rate;
    for (size_t i = 0; i < scales.size(); ++i)
      scales[i] = unit_double(hash_key(net.noise_key(), salt, i)) < keep ? float(1.0 / keep) : 0.0f;
    op->forward(net.act(this->inputs[0]), scales.data(), net.act(this->output));
  }
  void backward(Net<T>& net) override {
    const int x = this->inputs[0];
    op->backward(net.grad_of(this->output), net.grad_target(x));
    net.grad_done(x);
  }
};

template <class T>
class LossNode : public Node<T> {
 public:
  std::unique_ptr<SoftmaxXentOp<T>> op;
  void forward(Net<T>& net, bool) override {
    if (net.targets()) op->forward(net.act(this->inputs[0]), net.targets());
  }
  void backward(Net<T>& net) override {
    int x = this->inputs[0];
    op->backward(net.targets(), net.grad_target(x), net.loss_scale());
    net.grad_done(x);
  }
};

}  // namespace rt::detail
