// Launchers of the element-wise device kernels, callable from host C++ (C++17-clean: nvcc includes
// it too). All pointers are device pointers; every call is asynchronous on `stream`.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace rt::cuda {

// Storage type of a device buffer; the same values as rt::DType (nn/tensor.h, which nvcc's C++17
// cannot include), checked where the two meet.
enum class Elem : uint8_t { f32, bf16, f16 };

// dst[i] = dst[i] + src[i], i < n: the ring allreduce's reduction. 16-bit types add in fp32 and
// round once to nearest even.
void reduce_add(Elem t, void* dst, const void* src, size_t n, cudaStream_t stream);
// buf[i] = buf[i] * s (averaging: the sum scaled once by 1/ranks).
void scale(Elem t, void* buf, size_t n, float s, cudaStream_t stream);
// avg[i] = fma(w, x[i] - avg[i], avg[i]), fp32, each operation rounded once as on the host:
// the weights' moving average (Backend::ema_update), bitwise the CPU's.
void ema_update(float* avg, const float* x, size_t n, float w, cudaStream_t stream);
// dst[i] = src[i] * s in type `to` (product in fp32, one rounding to nearest even): gradient
// compression's f32 → bf16/f16 before a bucket's allreduce and back after. No overlap.
void convert(Elem to, void* dst, Elem from, const void* src, size_t n, float s,
             cudaStream_t stream);

// Loss scaling. Sets *flag (device int) to 1 if any of buf[0, n) is inf or NaN; never clears it,
// so one flag can collect several buffers (zero it before the first).
void nonfinite_check(Elem t, const void* buf, size_t n, int* flag, cudaStream_t stream);
// buf[i] *= inv_scale and the same check on the values before scaling, in one pass.
void unscale_check(Elem t, void* buf, size_t n, float inv_scale, int* flag, cudaStream_t stream);

// train.clip_grad_norm: sums[c] = Σ v[i]² over chunk c (elements [c * chunk, (c + 1) * chunk)
// of [0, n)), in double, in warp_order_squares' order (nn/optimizer.h), for c < ceil(n / chunk).
// The host adds the chunks' sums in order (DeviceBackend::sum_squares).
void chunk_squares(const float* v, size_t n, uint32_t chunk, double* sums, cudaStream_t stream);

// Input normalization: 8-bit NHWC RGB images (n, h, w, 3) to out[...] = p * scale[c] + shift[c]
// (scale = 1 / (255 std), shift = -mean / std, as data/ fuses them), in NCHW or NHWC.
struct NormalizeParams {
  float scale[3] = {1, 1, 1};
  float shift[3] = {0, 0, 0};
  bool nchw = true;  // false: NHWC, the same layout as the input
};
void normalize_u8(Elem out_type, const uint8_t* in, void* out, int64_t n, int64_t h, int64_t w,
                  const NormalizeParams& p, cudaStream_t stream);

}  // namespace rt::cuda
