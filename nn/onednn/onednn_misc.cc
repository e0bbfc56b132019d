// The cheap layers of the oneDNN backend: plain OpenMP loops over the backend layouts for ReLU,
// residual add, global average pooling, the zero-padded shortcut and softmax cross-entropy.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "nn/onednn/onednn_common.h"

namespace rt::dnn {
namespace {

class LoopRelu final : public ReluOp<float> {
 public:
  explicit LoopRelu(const ReluDesc& d) : n_(size_t(d.in.numel())) {}
  void forward(const float* x, float* y) override { relu_forward(x, y, n_); }
  void backward(const float* y, const float* dy, float* dx) override { relu_backward(y, dy, dx, n_); }

 private:
  size_t n_;
};

class LoopAdd final : public AddOp<float> {
 public:
  explicit LoopAdd(const AddDesc& d) : n_(size_t(d.in.numel())), relu_(d.relu) {}
  void forward(const float* a, const float* b, float* y) override { add_forward(a, b, y, n_, relu_); }
  void backward(const float* y, const float* dy, float* dx) override {
    if (relu_)
      relu_backward(y, dy, dx, n_);
    else if (dx != dy)
      std::memcpy(dx, dy, n_ * sizeof(float));
  }

 private:
  size_t n_;
  bool relu_;
};

// Blocked rows (n, channel block) of hw pixels of B channels: their means, and back.
template <int B>
void avgpool_blocked(const float* x, float* y, const Shape& in) {
  const int64_t cb_n = in.c / B, hw = in.h * in.w;
  const float inv = 1.f / float(hw);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < in.n; ++n)
    for (int64_t cb = 0; cb < cb_n; ++cb) {
      const float* src = x + (n * cb_n + cb) * hw * B;
      float acc[B] = {};
      for (int64_t p = 0; p < hw; ++p)
#pragma omp simd
        for (int k = 0; k < B; ++k) acc[k] += src[p * B + k];
      for (int k = 0; k < B; ++k) y[n * in.c + cb * B + k] = acc[k] * inv;
    }
}
template <int B>
void avgpool_blocked_backward(const float* dy, float* dx, const Shape& in) {
  const int64_t cb_n = in.c / B, hw = in.h * in.w;
  const float inv = 1.f / float(hw);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < in.n; ++n)
    for (int64_t cb = 0; cb < cb_n; ++cb) {
      float g[B];
      for (int k = 0; k < B; ++k) g[k] = dy[n * in.c + cb * B + k] * inv;
      float* dst = dx + (n * cb_n + cb) * hw * B;
      for (int64_t p = 0; p < hw; ++p)
#pragma omp simd
        for (int k = 0; k < B; ++k) dst[p * B + k] = g[k];
    }
}

// Input in its layout (blocked or plain), output (n, c, 1, 1) plain.
class LoopGlobalAvgPool final : public GlobalAvgPoolOp<float> {
 public:
  LoopGlobalAvgPool(const GlobalAvgPoolDesc& d, int block)
      : in_(d.in), block_(act_blocked(d.in, block) ? block : 0) {}

  void forward(const float* x, float* y) override {
    const int64_t n_n = in_.n, c_n = in_.c, hw = in_.h * in_.w;
    const float inv = 1.f / float(hw);
    if (block_ == 16) return avgpool_blocked<16>(x, y, in_);
    if (block_ == 8) return avgpool_blocked<8>(x, y, in_);
#pragma omp parallel for schedule(static) if (n_n * c_n * hw > 16384)
    for (int64_t nc = 0; nc < n_n * c_n; ++nc) {
      const float* src = x + nc * hw;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t p = 0; p < hw; ++p) acc += src[p];
      y[nc] = acc * inv;
    }
  }

  void backward(const float* dy, float* dx) override {
    const int64_t n_n = in_.n, c_n = in_.c, hw = in_.h * in_.w;
    const float inv = 1.f / float(hw);
    if (block_ == 16) return avgpool_blocked_backward<16>(dy, dx, in_);
    if (block_ == 8) return avgpool_blocked_backward<8>(dy, dx, in_);
#pragma omp parallel for schedule(static) if (n_n * c_n * hw > 16384)
    for (int64_t nc = 0; nc < n_n * c_n; ++nc) {
      const float g = dy[nc] * inv;
      for (int64_t p = 0; p < hw; ++p) dx[nc * hw + p] = g;
    }
  }

 private:
  Shape in_;
  int block_;  // 0: plain input
};

class LoopPadShortcut final : public PadShortcutOp<float> {
 public:
  LoopPadShortcut(const PadShortcutDesc& d, int block)
      : in_(d.in), out_(d.out()), stride_(d.stride), lo_((d.out_c - d.in.c) / 2),
        run_(act_blocked(in_, block) && act_blocked(out_, block) ? std::gcd(int64_t(block), lo_) : 0),
        xi_(in_, block), yi_(out_, block) {}

  void forward(const float* x, float* y) override {
    if (run_) {
      const int64_t R = run_, runs = out_.c / R;
      const size_t bytes = size_t(R) * sizeof(float);
#pragma omp parallel for collapse(2) schedule(static)
      for (int64_t n = 0; n < out_.n; ++n)
        for (int64_t h = 0; h < out_.h; ++h)
          for (int64_t w = 0; w < out_.w; ++w)
            for (int64_t k = 0; k < runs; ++k) {
              float* dst = y + yi_(n, k * R, h, w);
              const int64_t ic = k * R - lo_;
              if (ic < 0 || ic >= in_.c)
                std::memset(dst, 0, bytes);
              else
                std::memcpy(dst, x + xi_(n, ic, h * stride_, w * stride_), bytes);
            }
      return;
    }
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t n = 0; n < out_.n; ++n)
      for (int64_t c = 0; c < out_.c; ++c) {
        const int64_t ic = c - lo_;
        const bool pad = ic < 0 || ic >= in_.c;
        for (int64_t h = 0; h < out_.h; ++h)
          for (int64_t w = 0; w < out_.w; ++w)
            y[yi_(n, c, h, w)] = pad ? 0.f : x[xi_(n, ic, h * stride_, w * stride_)];
      }
  }

  void backward(const float* dy, float* dx) override {
    if (run_) {
      const int64_t R = run_, runs = in_.c / R;
      const size_t bytes = size_t(R) * sizeof(float);
#pragma omp parallel for collapse(2) schedule(static)
      for (int64_t n = 0; n < in_.n; ++n)
        for (int64_t h = 0; h < in_.h; ++h)
          for (int64_t w = 0; w < in_.w; ++w)
            for (int64_t k = 0; k < runs; ++k) {
              float* dst = dx + xi_(n, k * R, h, w);
              if (h % stride_ || w % stride_)
                std::memset(dst, 0, bytes);
              else
                std::memcpy(dst, dy + yi_(n, k * R + lo_, h / stride_, w / stride_), bytes);
            }
      return;
    }
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t n = 0; n < in_.n; ++n)
      for (int64_t c = 0; c < in_.c; ++c)
        for (int64_t h = 0; h < in_.h; ++h)
          for (int64_t w = 0; w < in_.w; ++w)
            dx[xi_(n, c, h, w)] =
                (h % stride_ || w % stride_) ? 0.f : dy[yi_(n, c + lo_, h / stride_, w / stride_)];
  }

 private:
  Shape in_, out_;
  int64_t stride_, lo_;
  // Both sides blocked: channels go in runs of this many, which stay whole inside a block on
  // both sides (it divides the block and the padding); 0: element by element.
  int64_t run_;
  ActIndex xi_, yi_;
};

// Logits (n, classes, 1, 1) are always plain, so this is a row-wise loop.
class LoopSoftmaxXent final : public SoftmaxXentOp<float> {
 public:
  explicit LoopSoftmaxXent(const SoftmaxXentDesc& d)
      : d_(d), n_(d.in.n), k_(d.in.c), eps_(d.loss.label_smoothing), prob_(size_t(d.in.n * d.in.c)) {}

  void forward(const float* logits, const Targets& t) override {
    d_.check_targets(t);
    if (d_.loss.kind == LossKind::bce) return forward_bce(logits, t);
    double total = 0;
    for (int64_t n = 0; n < n_; ++n) {
      const float* z = logits + n * k_;
      float* p = prob_.data() + n * k_;
      const float mx = *std::max_element(z, z + k_);
      double sum = 0, sum_z = 0;
      for (int64_t k = 0; k < k_; ++k) {
        p[k] = std::exp(z[k] - mx);
        sum += p[k];
        sum_z += z[k];
      }
      const double lse = mx + std::log(sum);
      const float inv = float(1.0 / sum);
      for (int64_t k = 0; k < k_; ++k) p[k] *= inv;
      // sum_k log p_k = sum_k z_k - K * lse.
      double logp_label = z[t.labels[n]] - lse;
      if (t.mixed) logp_label = t.mix * logp_label + (1 - t.mix) * (z[t.mixed[n]] - lse);
      const double mean_logp = sum_z / double(k_) - lse;
      total += -(1.0 - eps_) * logp_label - eps_ * mean_logp;
    }
    loss_ = total / double(n_);
  }
  double loss() override { return loss_; }

  void backward(const Targets& t, float* dlogits, double scale) override {
    d_.check_targets(t);
    if (d_.loss.kind == LossKind::bce) return backward_bce(t, dlogits, scale);
    const float g = float(scale / double(n_));
    const float off = float(eps_ / double(k_));
    // Blended targets split the one-hot part between the two labels (the same label twice: all of it).
    const float on_a = float((1.0 - eps_) * (t.mixed ? t.mix : 1.0));
    const float on_b = t.mixed ? float((1.0 - eps_) * (1 - t.mix)) : 0.0f;
    for (int64_t n = 0; n < n_; ++n) {
      const float* p = prob_.data() + n * k_;
      float* d = dlogits + n * k_;
      for (int64_t k = 0; k < k_; ++k) d[k] = g * (p[k] - off);
      d[t.labels[n]] -= g * on_a;
      if (t.mixed) d[t.mixed[n]] -= g * on_b;
    }
  }

 private:
  // Every class but the labelled ones has the same target, `off`: the loop applies it to all and
  // corrects the (at most two) labelled classes after.
  struct RowTargets {
    int32_t a, b;     // b = -1: one labelled class
    double ta, tb;
  };
  RowTargets row_targets(const Targets& t, int64_t n) const {
    const int32_t a = t.labels[n], b = t.mixed && t.mixed[n] != a ? t.mixed[n] : -1;
    return {a, b, d_.target(t, n, a), b >= 0 ? d_.target(t, n, b) : 0.0};
  }

  // Per element softplus(z) - z t, softplus as max(z, 0) + log1p(exp(-|z|)): no overflow.
  void forward_bce(const float* logits, const Targets& t) {
    const double off = d_.target_of(0.0);
    double total = 0;
    for (int64_t n = 0; n < n_; ++n) {
      const float* z = logits + n * k_;
      float* p = prob_.data() + n * k_;
      double row = 0;
      for (int64_t k = 0; k < k_; ++k) {
        const float e = std::exp(-std::fabs(z[k]));
        p[k] = (z[k] >= 0 ? 1.0f : e) / (1.0f + e);
        row += double(std::max(z[k], 0.0f) + std::log1p(e)) - double(z[k]) * off;
      }
      const RowTargets r = row_targets(t, n);
      row -= double(z[r.a]) * (r.ta - off);
      if (r.b >= 0) row -= double(z[r.b]) * (r.tb - off);
      total += row;
    }
    loss_ = total / double(n_ * k_);
  }

  void backward_bce(const Targets& t, float* dlogits, double scale) {
    const double g = scale / double(n_ * k_), off = d_.target_of(0.0);
    const float gf = float(g), offf = float(off);
    for (int64_t n = 0; n < n_; ++n) {
      const float* p = prob_.data() + n * k_;
      float* d = dlogits + n * k_;
      for (int64_t k = 0; k < k_; ++k) d[k] = gf * (p[k] - offf);
      const RowTargets r = row_targets(t, n);
      d[r.a] = float(g * (double(p[r.a]) - r.ta));
      if (r.b >= 0) d[r.b] = float(g * (double(p[r.b]) - r.tb));
    }
  }

  SoftmaxXentDesc d_;
  int64_t n_, k_;
  double eps_, loss_ = 0;
  Buffer<float> prob_;
};

}  // namespace

std::unique_ptr<ReluOp<float>> make_relu_op(const ContextPtr&, const ReluDesc& d) {
  return std::make_unique<LoopRelu>(d);
}
std::unique_ptr<AddOp<float>> make_add_op(const ContextPtr&, const AddDesc& d) {
  return std::make_unique<LoopAdd>(d);
}
std::unique_ptr<GlobalAvgPoolOp<float>> make_global_avgpool_op(const ContextPtr& ctx, const GlobalAvgPoolDesc& d) {
  return std::make_unique<LoopGlobalAvgPool>(d, ctx->block);
}
std::unique_ptr<PadShortcutOp<float>> make_pad_shortcut_op(const ContextPtr& ctx, const PadShortcutDesc& d) {
  return std::make_unique<LoopPadShortcut>(d, ctx->block);
}
std::unique_ptr<SoftmaxXentOp<float>> make_softmax_xent_op(const ContextPtr&, const SoftmaxXentDesc& d) {
  return std::make_unique<LoopSoftmaxXent>(d);
}

}  // namespace rt::dnn
