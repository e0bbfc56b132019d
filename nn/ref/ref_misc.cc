// Reference element-wise layers (ReLU, residual add, zero-padded shortcut, the channel gate of
// squeeze-and-excitation) and softmax cross-entropy with label smoothing.
#include <cmath>
#include <limits>
#include <vector>

#include "nn/ref/ref_ops.h"

namespace rt::ref {
namespace {

template <class T>
class RefRelu final : public ReluOp<T> {
 public:
  explicit RefRelu(const ReluDesc& d) : n_(d.in.numel()) {}
  void forward(const T* x, T* y) override {
    for (int64_t i = 0; i < n_; ++i) y[i] = T(relu_value(x[i]));
  }
  // The mask comes from the output, as torch's threshold_backward does.
  void backward(const T* y, const T* dy, T* dx) override {
    for (int64_t i = 0; i < n_; ++i) dx[i] = y[i] > T(0) ? dy[i] : T(0);
  }

 private:
  int64_t n_;
};

template <class T>
class RefAdd final : public AddOp<T> {
 public:
  explicit RefAdd(const AddDesc& d) : n_(d.in.numel()), relu_(d.relu) {}
  void forward(const T* a, const T* b, T* y) override {
    for (int64_t i = 0; i < n_; ++i) {
      const T s = a[i] + b[i];
      y[i] = relu_ ? T(relu_value(s)) : s;
    }
  }
  // Element-wise with each dy[i] read before dx[i] is written, so dx may alias dy.
  void backward(const T* y, const T* dy, T* dx) override {
    for (int64_t i = 0; i < n_; ++i) dx[i] = (!relu_ || y[i] > T(0)) ? dy[i] : T(0);
  }

 private:
  int64_t n_;
  bool relu_;
};

template <class T>
class RefPadShortcut final : public PadShortcutOp<T> {
 public:
  explicit RefPadShortcut(const PadShortcutDesc& d)
      : d_(d), out_(d.out()), before_((d.out_c - d.in.c) / 2) {}

  void forward(const T* x, T* y) override {
    const Shape& in = d_.in;
    for (int64_t n = 0; n < in.n; ++n)
      for (int64_t c = 0; c < out_.c; ++c) {
        T* yp = y + (n * out_.c + c) * out_.h * out_.w;
        const int64_t ic = c - before_;
        const bool zero = ic < 0 || ic >= in.c;
        const T* xp = x + (n * in.c + ic) * in.h * in.w;
        for (int64_t oh = 0; oh < out_.h; ++oh)
          for (int64_t ow = 0; ow < out_.w; ++ow)
            yp[oh * out_.w + ow] = zero ? T(0) : xp[oh * d_.stride * in.w + ow * d_.stride];
      }
  }

  void backward(const T* dy, T* dx) override {
    const Shape& in = d_.in;
    for (int64_t i = 0; i < in.numel(); ++i) dx[i] = T(0);
    for (int64_t n = 0; n < in.n; ++n)
      for (int64_t ic = 0; ic < in.c; ++ic) {
        const T* dyp = dy + (n * out_.c + ic + before_) * out_.h * out_.w;
        T* dxp = dx + (n * in.c + ic) * in.h * in.w;
        for (int64_t oh = 0; oh < out_.h; ++oh)
          for (int64_t ow = 0; ow < out_.w; ++ow)
            dxp[oh * d_.stride * in.w + ow * d_.stride] = dyp[oh * out_.w + ow];
      }
  }

 private:
  PadShortcutDesc d_;
  Shape out_;
  int64_t before_;  // zero channels ahead of the copied ones
};

template <class T>
class RefSoftmaxXent final : public SoftmaxXentOp<T> {
 public:
  explicit RefSoftmaxXent(const SoftmaxXentDesc& d)
      : d_(d), n_(d.in.n), k_(d.in.c), prob_(size_t(n_ * k_)) {}

  void forward(const T* logits, const Targets& t) override {
    d_.check_targets(t);
    if (d_.loss.kind == LossKind::bce) return forward_bce(logits, t);
    const double eps = d_.loss.label_smoothing;
    double total = 0;
    for (int64_t n = 0; n < n_; ++n) {
      const T* z = logits + n * k_;
      // log p_k = z_k - (m + log sum exp(z - m)) with m the max: no overflow for large logits.
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t k = 0; k < k_; ++k) m = std::max(m, double(z[k]));
      double se = 0;
      for (int64_t k = 0; k < k_; ++k) se += std::exp(double(z[k]) - m);
      const double lse = m + std::log(se);
      double sum_logp = 0;
      for (int64_t k = 0; k < k_; ++k) {
        const double logp = double(z[k]) - lse;
        sum_logp += logp;
        prob_[size_t(n * k_ + k)] = std::exp(logp);
      }
      double logp_label = double(z[t.labels[n]]) - lse;
      if (t.mixed) logp_label = t.mix * logp_label + (1 - t.mix) * (double(z[t.mixed[n]]) - lse);
      total += -(1 - eps) * logp_label - eps / double(k_) * sum_logp;
    }
    loss_ = total / double(n_);
  }
  double loss() override { return loss_; }

  // d(mean loss)/dz = (p - target) / N with target = (1 - eps) onehot + eps / K (with blended
  // targets the one-hot part is mix onehot(label) + (1 - mix) onehot(mixed)).
  // With bce, p is each class's sigmoid and the mean runs over N K elements: (p - target) / (N K).
  void backward(const Targets& t, T* dlogits, double scale) override {
    d_.check_targets(t);
    const double f = scale / double(d_.loss.kind == LossKind::bce ? n_ * k_ : n_);
    for (int64_t n = 0; n < n_; ++n)
      for (int64_t k = 0; k < k_; ++k)
        dlogits[n * k_ + k] = T((prob_[size_t(n * k_ + k)] - d_.target(t, n, k)) * f);
  }

 private:
  // Per element softplus(z) - z t (= -t log s(z) - (1 - t) log(1 - s(z))), softplus(z) written
  // max(z, 0) + log1p(exp(-|z|)) so that no exp overflows.
  void forward_bce(const T* logits, const Targets& t) {
    double total = 0;
    for (int64_t n = 0; n < n_; ++n)
      for (int64_t k = 0; k < k_; ++k) {
        const double z = double(logits[n * k_ + k]);
        const double e = std::exp(-std::fabs(z));  // in (0, 1]
        prob_[size_t(n * k_ + k)] = z >= 0 ? 1 / (1 + e) : e / (1 + e);
        total += std::max(z, 0.0) + std::log1p(e) - z * d_.target(t, n, k);
      }
    loss_ = total / double(n_ * k_);
  }

  SoftmaxXentDesc d_;
  int64_t n_, k_;
  std::vector<double> prob_;  // softmax of the last forward, for backward
  double loss_ = 0;
};

// sigmoid in double: the gate's oracle.
inline double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

template <class T>
class RefChannelGate final : public ChannelGateOp<T> {
 public:
  explicit RefChannelGate(const ChannelGateDesc& d) : planes_(d.in.n * d.in.c), hw_(d.in.h * d.in.w) {}

  void forward(const T* x, const T* g, T* y) override {
    for (int64_t pl = 0; pl < planes_; ++pl) {
      const double s = sigmoid(double(g[pl]));
      for (int64_t e = 0; e < hw_; ++e) y[pl * hw_ + e] = T(double(x[pl * hw_ + e]) * s);
    }
  }

  void backward(const T* x, const T* g, const T* dy, T* dx, T* dg) override {
    for (int64_t pl = 0; pl < planes_; ++pl) {
      const double s = sigmoid(double(g[pl]));
      double dot = 0;
      for (int64_t e = 0; e < hw_; ++e) {
        const int64_t i = pl * hw_ + e;
        dot += double(dy[i]) * double(x[i]);
        dx[i] = T(double(dy[i]) * s);
      }
      dg[pl] = T(dot * s * (1.0 - s));
    }
  }

 private:
  int64_t planes_, hw_;
};

}  // namespace

template <class T>
std::unique_ptr<ReluOp<T>> make_relu(const ReluDesc& d) {
  return std::make_unique<RefRelu<T>>(d);
}
template <class T>
std::unique_ptr<AddOp<T>> make_add(const AddDesc& d) {
  return std::make_unique<RefAdd<T>>(d);
}
template <class T>
std::unique_ptr<PadShortcutOp<T>> make_pad_shortcut(const PadShortcutDesc& d) {
  d.validate();
  return std::make_unique<RefPadShortcut<T>>(d);
}
template <class T>
std::unique_ptr<SoftmaxXentOp<T>> make_softmax_xent(const SoftmaxXentDesc& d) {
  d.validate();
  return std::make_unique<RefSoftmaxXent<T>>(d);
}

template <class T>
std::unique_ptr<ChannelGateOp<T>> make_channel_gate(const ChannelGateDesc& d) {
  d.validate();
  return std::make_unique<RefChannelGate<T>>(d);
}

template std::unique_ptr<ReluOp<float>> make_relu<float>(const ReluDesc&);
template std::unique_ptr<ReluOp<double>> make_relu<double>(const ReluDesc&);
template std::unique_ptr<AddOp<float>> make_add<float>(const AddDesc&);
template std::unique_ptr<AddOp<double>> make_add<double>(const AddDesc&);
template std::unique_ptr<PadShortcutOp<float>> make_pad_shortcut<float>(const PadShortcutDesc&);
template std::unique_ptr<PadShortcutOp<double>> make_pad_shortcut<double>(const PadShortcutDesc&);
template std::unique_ptr<SoftmaxXentOp<float>> make_softmax_xent<float>(const SoftmaxXentDesc&);
template std::unique_ptr<SoftmaxXentOp<double>> make_softmax_xent<double>(const SoftmaxXentDesc&);
template std::unique_ptr<ChannelGateOp<float>> make_channel_gate<float>(const ChannelGateDesc&);
template std::unique_ptr<ChannelGateOp<double>> make_channel_gate<double>(const ChannelGateDesc&);

}  // namespace rt::ref
