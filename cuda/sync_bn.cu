// The fp32 synchronised batch norm's kernels (sync_bn.h): a block per channel for its sums, grid-
// stride loops over the elements for the rest.
#include "cuda/block_reduce.cuh"
#include "cuda/check.h"
#include "cuda/launch.h"
#include "cuda/sync_bn.h"

namespace rt::cuda {
namespace {

__device__ inline int64_t first_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }
__device__ inline int64_t channel_of(int64_t i, const NchwBnGeom& g) { return i / g.hw % g.c; }

// Channel blockIdx.x: thread t takes its values t, t + blockDim.x, ... in (n, hw) order.
__global__ void nchw_sums_kernel(NchwSumArgs a, NchwBnGeom g) {
  __shared__ double scratch[32];
  const int64_t c = blockIdx.x, m = g.n * g.hw;
  const float mean = a.mean ? a.mean[c] : 0.0f, invstd = a.invstd ? a.invstd[c] : 0.0f;
  double s1 = 0, s2 = 0;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
    const int64_t at = (i / g.hw * g.c + c) * g.hw + i % g.hw;
    const double x = a.x[at];
    if (a.kind == NchwSum::x) {
      s1 += x;
    } else if (a.kind == NchwSum::sq_dev) {
      s1 += (x - mean) * (x - mean);
    } else {
      const double d = (a.y && !(a.y[at] > 0.0f)) ? 0.0 : double(a.dy[at]);
      s1 += d;
      s2 += d * (x - mean) * invstd;
    }
  }
  s1 = block_reduce(s1, SumOp{}, 0.0, scratch);
  if (a.kind == NchwSum::grad) s2 = block_reduce(s2, SumOp{}, 0.0, scratch);
  if (threadIdx.x == 0) {
    a.s1[c] = float(s1);
    if (a.kind == NchwSum::grad) a.s2[c] = float(s2);
  }
}

__global__ void nchw_apply_kernel(const float* x, const float* mean, const float* scale, const float* beta,
                                  float* y, NchwBnGeom g, bool relu) {
  const int64_t n = g.n * g.c * g.hw;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t c = channel_of(i, g);
    const float v = (x[i] - mean[c]) * scale[c] + beta[c];
    y[i] = relu && !(v > 0.0f || isnan(v)) ? 0.0f : v;
  }
}

__global__ void nchw_dx_kernel(NchwBnDxArgs a, NchwBnGeom g) {
  const int64_t n = g.n * g.c * g.hw;
  const float inv_m = 1.0f / float(a.m);
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t c = channel_of(i, g);
    const float invstd = a.invstd[c];
    const float d = (a.y && !(a.y[i] > 0.0f)) ? 0.0f : a.dy[i];
    const float xhat = (a.x[i] - a.mean[c]) * invstd;
    a.dx[i] = a.gamma[c] * invstd * (d - a.sum_g[c] * inv_m - xhat * a.sum_gxhat[c] * inv_m);
  }
}

uint32_t blocks_for(int64_t n) { return grid_for(size_t(n)); }

}  // namespace

void nchw_channel_sums(const NchwSumArgs& a, const NchwBnGeom& g, cudaStream_t stream) {
  if (g.c <= 0) return;
  nchw_sums_kernel<<<uint32_t(g.c), kThreads, 0, stream>>>(a, g);
  CUDA_CHECK_LAUNCH();
}

void nchw_bn_apply(const float* x, const float* mean, const float* scale, const float* beta, float* y,
                   const NchwBnGeom& g, bool relu, cudaStream_t stream) {
  const int64_t n = g.n * g.c * g.hw;
  if (n <= 0) return;
  nchw_apply_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, mean, scale, beta, y, g, relu);
  CUDA_CHECK_LAUNCH();
}

void nchw_bn_dx(const NchwBnDxArgs& a, const NchwBnGeom& g, cudaStream_t stream) {
  const int64_t n = g.n * g.c * g.hw;
  if (n <= 0 || !a.dx) return;
  nchw_dx_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, g);
  CUDA_CHECK_LAUNCH();
}

}  // namespace rt::cuda
