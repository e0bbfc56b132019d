// Launchers of the bf16 backend's kernels (cuda-bf16): activations and their gradients are bf16
// in NHWC, parameters and statistics fp32, all arithmetic fp32 with one rounding per stored
// result. C++17-clean (nvcc includes it). Pointers are device pointers; every call is
// asynchronous on `stream`.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/bf16_layout.h"
#include "cuda/layer_kernels.h"  // ShortcutGeom

namespace rt::cuda {

using bf16 = __nv_bfloat16;

struct Dims4 {
  int64_t n = 0, c = 0, h = 0, w = 0;
  RT_HOST_DEVICE int64_t numel() const { return n * c * h * w; }
};

// Layout and type conversions.
void nchw_f32_to_nhwc_bf16(const float* src, bf16* dst, const Dims4& d, cudaStream_t stream);
void nhwc_bf16_to_nchw_f32(const bf16* src, float* dst, const Dims4& d, cudaStream_t stream);
void f32_to_bf16(const float* src, bf16* dst, int64_t n, cudaStream_t stream);
void bf16_to_f32(const bf16* src, float* dst, int64_t n, cudaStream_t stream);
// The private weight copy: canonical OIHW fp32 to OHWI bf16; and a weight gradient computed in
// OHWI (bf16 or fp32) back to the arena's OIHW fp32 (overwritten).
void weight_to_ohwi_bf16(const float* oihw, bf16* ohwi, const WeightGeom& g, cudaStream_t stream);
void weight_grad_to_oihw(const bf16* ohwi, float* oihw, const WeightGeom& g, cudaStream_t stream);
void weight_grad_to_oihw(const float* ohwi, float* oihw, const WeightGeom& g, cudaStream_t stream);

// Element-wise (any layout): y = relu(x); dx = y > 0 ? dy : 0 (dx may alias dy); y = a + b
// (then relu).
void bf16_relu_forward(const bf16* x, bf16* y, int64_t n, cudaStream_t stream);
void bf16_relu_backward(const bf16* y, const bf16* dy, bf16* dx, int64_t n, cudaStream_t stream);
void bf16_add_forward(const bf16* a, const bf16* b, bf16* y, int64_t n, bool relu,
                      cudaStream_t stream);

// Per-channel bias on NHWC data with `channels` innermost: y[r][c] += b[c] in place (bf16), and
// y[r][c] = y32[r][c] + b[c] from an fp32 result (b may be null: a plain conversion).
void bf16_bias_add(bf16* y, const float* b, int64_t rows, int64_t channels, cudaStream_t stream);
void f32_bias_to_bf16(const float* y32, const float* b, bf16* y, int64_t rows, int64_t channels,
                      cudaStream_t stream);

// Max pooling on NHWC, padding as -inf; argmax[n][oh][ow][c] is the in-plane input index
// ih * w + iw. Rows then columns, replacing on a strictly larger value or NaN: ties go to the
// first maximum in window order. Backward gathers, per input element, dy of the windows whose
// maximum it was, in output order, summed in fp32 (deterministic, no atomics).
struct NhwcPoolGeom {
  int64_t n = 0, c = 0, h = 0, w = 0, out_h = 0, out_w = 0;
  int64_t kernel = 1, stride = 1, pad = 0;
};
void bf16_maxpool_forward(const bf16* x, bf16* y, int32_t* argmax, const NhwcPoolGeom& g,
                          cudaStream_t stream);
void bf16_maxpool_backward(const int32_t* argmax, const bf16* dy, bf16* dx, const NhwcPoolGeom& g,
                           cudaStream_t stream);
// Global average pooling on NHWC: y[n][c] = mean over hw of x[n][.][c] (fp32 sum).
void bf16_avgpool_forward(const bf16* x, bf16* y, int64_t n, int64_t c, int64_t hw,
                          cudaStream_t stream);
void bf16_avgpool_backward(const bf16* dy, bf16* dx, int64_t n, int64_t c, int64_t hw,
                           cudaStream_t stream);
// CIFAR shortcut "A" on NHWC (the geometry as the fp32 kernels').
void bf16_pad_shortcut_forward(const bf16* x, bf16* y, const ShortcutGeom& g, cudaStream_t stream);
void bf16_pad_shortcut_backward(const bf16* dy, bf16* dx, const ShortcutGeom& g,
                                cudaStream_t stream);

// Per-channel sums over the rows of NHWC data (see ChannelReduceGeom), two sums s1, s2 per
// channel. partial holds 2 * chunks * channels floats.
enum class ChannelSum : int {
  x,          // s1 = x
  sq_dev,     // s1 = (x - mean[c])^2
  dy,         // s1 = dy
  bn_grad,    // s1 = g, s2 = g * (x - mean[c]) * invstd[c], g = dy masked by y > 0 when relu
};
struct ChannelSumArgs {
  ChannelSum kind = ChannelSum::x;
  const bf16* x = nullptr;
  const bf16* y = nullptr;   // bn_grad with relu only
  const bf16* dy = nullptr;
  const float* mean = nullptr;
  const float* invstd = nullptr;
  bool relu = false;
  float* partial = nullptr;
};
// Runs both passes: the chunk partials, then the per-channel totals, summed in double in chunk
// order, into s1 (and s2 for bn_grad), fp32 [channels].
void channel_sums(const ChannelSumArgs& a, const ChannelReduceGeom& g, float* s1, float* s2,
                  cudaStream_t stream);

// Batch norm from per-channel sums (m = rows, the values per channel).
// mean[c] = sum_x[c] / m, in place.
void bn_mean_from_sum(float* mean, int64_t channels, int64_t m, cudaStream_t stream);
// Training statistics from the mean and the sum of squared deviations: var = var_sum / m (the
// biased variance normalises), invstd = 1 / sqrt(var + eps), scale = gamma * invstd; running_mean
// and running_var (unbiased: var * m / (m - 1)) move by momentum, as PyTorch.
struct BnStatsArgs {
  int64_t channels = 0, m = 0;
  double eps = 1e-5, momentum = 0.1;
  const float* gamma = nullptr;
  const float* mean = nullptr;
  const float* var_sum = nullptr;
  float* invstd = nullptr;  // kept for backward
  float* scale = nullptr;
  float* running_mean = nullptr;
  float* running_var = nullptr;
};
void bn_train_stats(const BnStatsArgs& a, cudaStream_t stream);
// Evaluation: scale = gamma / sqrt(running_var + eps).
void bn_eval_scale(const float* gamma, const float* running_var, double eps, float* scale,
                   int64_t channels, cudaStream_t stream);
// y = (x - mean[c]) * scale[c] + beta[c], then relu when asked; NHWC, c innermost.
void bn_apply(const bf16* x, const float* mean, const float* scale, const float* beta, bf16* y,
              int64_t rows, int64_t channels, bool relu, cudaStream_t stream);
// dx = gamma invstd / m * (m g - sum_g - xhat sum_gxhat), xhat = (x - mean) invstd, g as in
// ChannelSum::bn_grad (PyTorch's formula, as nn/ref).
struct BnBackwardArgs {
  int64_t rows = 0, channels = 0;
  bool relu = false;
  const bf16* x = nullptr;
  const bf16* y = nullptr;
  const bf16* dy = nullptr;
  const float* gamma = nullptr;
  const float* mean = nullptr;
  const float* invstd = nullptr;
  const float* sum_g = nullptr;      // dbeta
  const float* sum_gxhat = nullptr;  // dgamma
  bf16* dx = nullptr;
};
void bn_backward_dx(const BnBackwardArgs& a, cudaStream_t stream);

}  // namespace rt::cuda
