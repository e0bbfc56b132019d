// Launchers of the 16-bit backends' kernels (cuda-bf16, cuda-fp16): activations and their
// gradients are T = bf16 or f16 (IEEE half) in NHWC, parameters and statistics fp32, all
// arithmetic fp32 with one rounding to nearest even per stored result (for f16, magnitudes past
// 65504 round to inf, which loss scaling reads as an overflow). Templates instantiated for the two
// types in lowp_kernels.cu (per-channel sums: lowp_channel_sums.cu; batch norm: lowp_bn.cu).
// C++17-clean (nvcc includes it). Pointers are device pointers; every call is asynchronous on
// `stream`.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <library_types.h>

#include <cstdint>

#include "cuda/kernels.h"        // Elem
#include "cuda/layer_kernels.h"  // ShortcutGeom
#include "cuda/lowp_layout.h"

namespace rt::cuda {

using bf16 = __nv_bfloat16;
using f16 = __half;

// What differs between the two storage types outside the kernels.
template <class T> struct Lowp;
template <> struct Lowp<bf16> {
  static constexpr const char* name = "bf16";
  static constexpr const char* backend = "cuda-bf16";
  static constexpr Elem elem = Elem::bf16;
  static constexpr cudaDataType_t blas = CUDA_R_16BF;
};
template <> struct Lowp<f16> {
  static constexpr const char* name = "fp16";
  static constexpr const char* backend = "cuda-fp16";
  static constexpr Elem elem = Elem::f16;
  static constexpr cudaDataType_t blas = CUDA_R_16F;
};

struct Dims4 {
  int64_t n = 0, c = 0, h = 0, w = 0;
  RT_HOST_DEVICE int64_t numel() const { return n * c * h * w; }
};

// Layout and type conversions.
template <class T>
void nchw_f32_to_nhwc_lowp(const float* src, T* dst, const Dims4& d, cudaStream_t stream);
template <class T>
void nhwc_lowp_to_nchw_f32(const T* src, float* dst, const Dims4& d, cudaStream_t stream);
template <class T>
void f32_to_lowp(const float* src, T* dst, int64_t n, cudaStream_t stream);
template <class T>
void lowp_to_f32(const T* src, float* dst, int64_t n, cudaStream_t stream);
// The private weight copy: canonical OIHW fp32 to OHWI T; and a weight gradient computed in
// OHWI (S = T or fp32) back to the arena's OIHW fp32 (overwritten).
template <class T>
void weight_to_ohwi_lowp(const float* oihw, T* ohwi, const WeightGeom& g, cudaStream_t stream);
template <class S>
void weight_grad_to_oihw(const S* ohwi, float* oihw, const WeightGeom& g, cudaStream_t stream);

// Element-wise (any layout): y = relu(x); dx = y > 0 ? dy : 0 (dx may alias dy); y = a + b
// (then relu).
template <class T>
void lowp_relu_forward(const T* x, T* y, int64_t n, cudaStream_t stream);
template <class T>
void lowp_relu_backward(const T* y, const T* dy, T* dx, int64_t n, cudaStream_t stream);
template <class T>
void lowp_add_forward(const T* a, const T* b, T* y, int64_t n, bool relu, cudaStream_t stream);

// Per-channel bias on NHWC data with `channels` innermost: y[r][c] += b[c] in place (T), and
// y[r][c] = y32[r][c] + b[c] from an fp32 result (b may be null: a plain conversion).
template <class T>
void lowp_bias_add(T* y, const float* b, int64_t rows, int64_t channels, cudaStream_t stream);
template <class T>
void f32_bias_to_lowp(const float* y32, const float* b, T* y, int64_t rows, int64_t channels,
                      cudaStream_t stream);

// Max pooling on NHWC, padding as -inf; argmax[n][oh][ow][c] is the in-plane input index
// ih * w + iw. Rows then columns, replacing on a strictly larger value or NaN: ties go to the
// first maximum in window order. Backward gathers, per input element, dy of the windows whose
// maximum it was, in output order, summed in fp32 (deterministic, no atomics).
struct NhwcPoolGeom {
  int64_t n = 0, c = 0, h = 0, w = 0, out_h = 0, out_w = 0;
  int64_t kernel = 1, stride = 1, pad = 0;
};
template <class T>
void lowp_maxpool_forward(const T* x, T* y, int32_t* argmax, const NhwcPoolGeom& g,
                          cudaStream_t stream);
template <class T>
void lowp_maxpool_backward(const int32_t* argmax, const T* dy, T* dx, const NhwcPoolGeom& g,
                           cudaStream_t stream);
// Windowed average pooling on NHWC (AvgPoolDesc; out_h and out_w from the desc, ceil_mode in
// them), padding and the part past the input not counted. Forward: the window summed in double in
// window order and divided by its count, the fp32 result rounded to T: the fp32 reference's output
// rounded to T. Backward gathers per input element, in output order, the fp32 terms dy / count of
// the windows that contain it, summed in fp32 (the reference's sums) and rounded once to T.
template <class T>
void lowp_window_avgpool_forward(const T* x, T* y, const NhwcPoolGeom& g, cudaStream_t stream);
template <class T>
void lowp_window_avgpool_backward(const T* dy, T* dx, const NhwcPoolGeom& g, cudaStream_t stream);
// Global average pooling on NHWC: y[n][c] = mean over hw of x[n][.][c] (fp32 sum).
template <class T>
void lowp_avgpool_forward(const T* x, T* y, int64_t n, int64_t c, int64_t hw,
                          cudaStream_t stream);
template <class T>
void lowp_avgpool_backward(const T* dy, T* dx, int64_t n, int64_t c, int64_t hw,
                           cudaStream_t stream);
// Squeeze-and-excitation's gate on NHWC (cuda/lowp_gate.cu): y = x * sigmoid(g[n][c]); backward
// dx = dy * s, dg[n][c] = s (1 - s) * (fp32 sum over hw of dy * x). dx may alias dy.
template <class T>
void lowp_gate_forward(const T* x, const T* g, T* y, int64_t n, int64_t c, int64_t hw, cudaStream_t stream);
template <class T>
void lowp_gate_backward(const T* x, const T* g, const T* dy, T* dx, T* dg, int64_t n, int64_t c, int64_t hw,
                        cudaStream_t stream);
// CIFAR shortcut "A" on NHWC (the geometry as the fp32 kernels').
template <class T>
void lowp_pad_shortcut_forward(const T* x, T* y, const ShortcutGeom& g, cudaStream_t stream);
template <class T>
void lowp_pad_shortcut_backward(const T* dy, T* dx, const ShortcutGeom& g, cudaStream_t stream);

// Per-channel sums over the rows of NHWC data (see ChannelReduceGeom), two sums s1, s2 per
// channel. partial holds 2 * chunks * channels floats.
enum class ChannelSum : int {
  x,          // s1 = x
  sq_dev,     // s1 = (x - mean[c])^2
  dy,         // s1 = dy
  bn_grad,    // s1 = g, s2 = g * (x - mean[c]) * invstd[c], g = dy masked by y > 0 when relu
  bn_grad_add_relu,  // as bn_grad, g = dy masked by out > 0 (a residual's ReLU), stored to g_out
};
// bn_grad with relu recomputes y from x, mean, scale and beta as the forward did (bn_apply):
// the mask is exact without reading y. bn_grad_add_relu reads the block's output instead (the
// residual is not at hand to recompute it) and writes the masked gradient, bit for bit what
// lowp_relu_backward writes, for the residual's branch (g_out may be dy).
template <class T>
struct ChannelSumArgs {
  ChannelSum kind = ChannelSum::x;
  const T* x = nullptr;
  const T* dy = nullptr;
  const float* mean = nullptr;
  const float* invstd = nullptr;
  const float* scale = nullptr;  // bn_grad with relu: the forward's scale and beta
  const float* beta = nullptr;
  bool relu = false;
  const T* out = nullptr;  // bn_grad_add_relu
  T* g_out = nullptr;
  float* partial = nullptr;
};
// Runs both passes: the chunk partials, then the per-channel totals, summed in double in a fixed
// order, into s1 (and s2 for bn_grad), fp32 [channels].
template <class T>
void channel_sums(const ChannelSumArgs<T>& a, const ChannelReduceGeom& g, float* s1, float* s2,
                  cudaStream_t stream);
// A convolution's or linear layer's bias gradient: db[c] = the sum of dy's rows (dy passed
// through the float* interface, as the layers hold it).
template <class T>
void bias_grad(const float* dy, float* partial, const ChannelReduceGeom& g, float* db,
               cudaStream_t stream) {
  ChannelSumArgs<T> a;
  a.kind = ChannelSum::dy;
  a.dy = reinterpret_cast<const T*>(dy);
  a.partial = partial;
  channel_sums(a, g, db, nullptr, stream);
}

// Training statistics from the mean and the sum of squared deviations: var = var_sum / m (the
// biased variance normalises), invstd = 1 / sqrt(var + eps), scale = gamma * invstd, beta copied
// to beta_saved (what backward recomputes y with); running_mean and running_var (unbiased:
// var * m / (m - 1)) move by momentum, as PyTorch.
struct BnStatsArgs {
  int64_t channels = 0, m = 0;
  double eps = 1e-5, momentum = 0.1;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  const float* mean = nullptr;
  const float* var_sum = nullptr;
  float* invstd = nullptr;  // kept for backward
  float* scale = nullptr;
  float* beta_saved = nullptr;
  float* running_mean = nullptr;
  float* running_var = nullptr;
};
void bn_train_stats(const BnStatsArgs& a, cudaStream_t stream);
// A batch's per-channel mean and sum of squared deviations from the mean (var_sum), fp32, over
// the rows of x: one pass (Welford's running mean and M2, merged by Chan's formula) on the vector
// grid, else two (the mean, then the squared deviations). partial as for channel_sums. With
// `then` (its mean and var_sum these ones), bn_train_stats follows, on the vector grid inside
// the kernel that totals the chunks.
template <class T>
void bn_batch_stats(const T* x, const ChannelReduceGeom& g, float* partial, float* mean,
                    float* var_sum, cudaStream_t stream, const BnStatsArgs* then = nullptr);
// Evaluation: scale = gamma / sqrt(running_var + eps).
void bn_eval_scale(const float* gamma, const float* running_var, double eps, float* scale,
                   int64_t channels, cudaStream_t stream);
// y = (x - mean[c]) * scale[c] + beta[c] (one fused multiply-add), then relu when asked; NHWC,
// c innermost. With a residual r (nullptr: none), y = relu?(T(v) + r) in fp32 rounded once:
// exactly the batch norm's stored output and then lowp_add_forward.
// g: channel_reduce_geom(rows, channels) of x, as the caller keeps it.
template <class T>
void bn_apply(const T* x, const T* residual, const float* mean, const float* scale, const float* beta,
              T* y, const ChannelReduceGeom& g, bool relu, cudaStream_t stream);
// dx = gamma invstd / m * (m g - sum_g - xhat sum_gxhat), xhat = (x - mean) invstd, g as in
// ChannelSum::bn_grad (PyTorch's formula, as nn/ref); dx may alias dy.
template <class T>
struct BnBackwardArgs {
  bool relu = false;
  const T* x = nullptr;
  const T* dy = nullptr;
  const float* gamma = nullptr;
  const float* mean = nullptr;
  const float* invstd = nullptr;
  const float* scale = nullptr;  // relu: the forward's scale and beta
  const float* beta = nullptr;
  const float* sum_g = nullptr;      // dbeta
  const float* sum_gxhat = nullptr;  // dgamma
  int64_t m = 0;  // the values per channel both sums are over (0: x's rows; model.bn_group: the group's)
  T* dx = nullptr;
};
template <class T>
void bn_backward_dx(const BnBackwardArgs<T>& a, const ChannelReduceGeom& g, cudaStream_t stream);

}  // namespace rt::cuda
