// Kernels of the fp32 backends' synchronised batch norm (model.bn_group), whose group sums
// cuDNN's batch norm has no place for: per-channel sums over NCHW fp32 data, the normalisation
// and dx. The per-channel statistics between them are lowp_kernels.h's (bn_train_stats,
// bn_eval_scale: they read and write per-channel vectors only). C++17-clean (nvcc includes it);
// device pointers, asynchronous on `stream`.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace rt::cuda {

struct NchwBnGeom {
  int64_t n = 0, c = 0, hw = 0;
};

// Two sums per channel over its n * hw values, in double in a fixed order (a block per channel):
//   x:       s1 = sum x
//   sq_dev:  s1 = sum (x - mean[c])^2
//   grad:    s1 = sum g, s2 = sum g (x - mean[c]) invstd[c], g = dy, or 0 where y <= 0 (y given:
//            the fused ReLU's output, whose mask passes the gradient; null: no ReLU)
enum class NchwSum : int { x, sq_dev, grad };
struct NchwSumArgs {
  NchwSum kind = NchwSum::x;
  const float* x = nullptr;
  const float* dy = nullptr;
  const float* y = nullptr;
  const float* mean = nullptr;
  const float* invstd = nullptr;
  float* s1 = nullptr;
  float* s2 = nullptr;
};
void nchw_channel_sums(const NchwSumArgs& a, const NchwBnGeom& g, cudaStream_t stream);

// y = (x - mean[c]) scale[c] + beta[c], then ReLU when asked.
void nchw_bn_apply(const float* x, const float* mean, const float* scale, const float* beta, float* y,
                   const NchwBnGeom& g, bool relu, cudaStream_t stream);

// dx = gamma invstd (g - sum_g / m - xhat sum_gxhat / m), xhat = (x - mean) invstd, g as for
// NchwSum::grad; m the values per channel the sums are over (the group's).
struct NchwBnDxArgs {
  const float* x = nullptr;
  const float* dy = nullptr;
  const float* y = nullptr;  // the ReLU's output for its mask, or null
  const float* gamma = nullptr;
  const float* mean = nullptr;
  const float* invstd = nullptr;
  const float* sum_g = nullptr;
  const float* sum_gxhat = nullptr;
  int64_t m = 0;
  float* dx = nullptr;
};
void nchw_bn_dx(const NchwBnDxArgs& a, const NchwBnGeom& g, cudaStream_t stream);

}  // namespace rt::cuda
