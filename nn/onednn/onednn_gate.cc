// The channel gate of squeeze-and-excitation on the oneDNN backend: loops over the activation
// layout (nChw8c / nChw16c, or plain NCHW), one block of channels' gate values held in registers
// while its pixels stream past.
#include <cmath>

#include "nn/onednn/onednn_common.h"

namespace rt::dnn {
namespace {

// Rows (n, channel block) of hw pixels of B channels; B = 1 is plain NCHW. The gate g is (n, c)
// plain either way (its 1x1 extent keeps it unblocked: act_blocked).
template <int B>
void gate_forward(const float* x, const float* g, float* y, const Shape& in) {
  const int64_t cb_n = in.c / B, hw = in.h * in.w;
#pragma omp parallel for collapse(2) schedule(static) if (in.numel() > (1 << 15))
  for (int64_t n = 0; n < in.n; ++n)
    for (int64_t cb = 0; cb < cb_n; ++cb) {
      float s[B];
      for (int k = 0; k < B; ++k) s[k] = float(1.0 / (1.0 + std::exp(-double(g[n * in.c + cb * B + k]))));
      const int64_t row = (n * cb_n + cb) * hw * B;
      const float* src = x + row;
      float* dst = y + row;
      for (int64_t p = 0; p < hw; ++p)
#pragma omp simd
        for (int k = 0; k < B; ++k) dst[p * B + k] = src[p * B + k] * s[k];
    }
}

// dx = dy s and, per channel, dg = s (1 - s) sum_p dy x, in one pass over the row.
template <int B>
void gate_backward(const float* x, const float* g, const float* dy, float* dx, float* dg, const Shape& in) {
  const int64_t cb_n = in.c / B, hw = in.h * in.w;
#pragma omp parallel for collapse(2) schedule(static) if (in.numel() > (1 << 15))
  for (int64_t n = 0; n < in.n; ++n)
    for (int64_t cb = 0; cb < cb_n; ++cb) {
      float s[B], acc[B] = {};
      for (int k = 0; k < B; ++k) s[k] = float(1.0 / (1.0 + std::exp(-double(g[n * in.c + cb * B + k]))));
      const int64_t row = (n * cb_n + cb) * hw * B;
      const float *xr = x + row, *dyr = dy + row;
      float* dxr = dx + row;
      for (int64_t p = 0; p < hw; ++p)
#pragma omp simd
        for (int k = 0; k < B; ++k) {
          const float d = dyr[p * B + k];
          acc[k] += d * xr[p * B + k];
          dxr[p * B + k] = d * s[k];
        }
      for (int k = 0; k < B; ++k) dg[n * in.c + cb * B + k] = acc[k] * s[k] * (1.f - s[k]);
    }
}

class LoopChannelGate final : public ChannelGateOp<float> {
 public:
  LoopChannelGate(const ChannelGateDesc& d, int block) : in_(d.in), block_(act_blocked(d.in, block) ? block : 1) {}

  void forward(const float* x, const float* g, float* y) override {
    if (block_ == 16) return gate_forward<16>(x, g, y, in_);
    if (block_ == 8) return gate_forward<8>(x, g, y, in_);
    gate_forward<1>(x, g, y, in_);
  }

  void backward(const float* x, const float* g, const float* dy, float* dx, float* dg) override {
    if (block_ == 16) return gate_backward<16>(x, g, dy, dx, dg, in_);
    if (block_ == 8) return gate_backward<8>(x, g, dy, dx, dg, in_);
    gate_backward<1>(x, g, dy, dx, dg, in_);
  }

 private:
  Shape in_;
  int block_;  // 1: plain input
};

}  // namespace

std::unique_ptr<ChannelGateOp<float>> make_channel_gate_op(const ContextPtr& ctx, const ChannelGateDesc& d) {
  d.validate();
  return std::make_unique<LoopChannelGate>(d, ctx->block);
}

}  // namespace rt::dnn
