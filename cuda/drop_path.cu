// Stochastic depth's per-sample scaling: a block row per sample, so no element divides its index.
#include <algorithm>

#include "cuda/drop_path_kernel.h"
#include "cuda/elementwise.cuh"

namespace rt::cuda {
namespace {

template <class T>
__global__ void drop_path_kernel(const T* x, const float* scales, T* y, int64_t per_sample) {
  const float s = scales[blockIdx.y];
  const int64_t base = int64_t(blockIdx.y) * per_sample, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < per_sample; i += stride)
    y[base + i] = from_f32<T>(to_f32(x[base + i]) * s);
}

}  // namespace

template <class T>
void drop_path_launch(const T* x, const float* scales, T* y, int64_t samples, int64_t per_sample,
                      cudaStream_t stream) {
  if (samples <= 0 || per_sample <= 0) return;
  if (samples > 65535) throw Error(str_cat("cuda drop path: ", samples, " samples (at most 65535)"));
  // About kMaxBlocks blocks in all, at least one per sample.
  const uint32_t across = std::max<uint32_t>(1, std::min(grid_for(size_t(per_sample)), kMaxBlocks / uint32_t(samples)));
  drop_path_kernel<T><<<dim3(across, uint32_t(samples)), kThreads, 0, stream>>>(x, scales, y, per_sample);
  CUDA_CHECK_LAUNCH();
}

template void drop_path_launch<float>(const float*, const float*, float*, int64_t, int64_t, cudaStream_t);
template void drop_path_launch<__nv_bfloat16>(const __nv_bfloat16*, const float*, __nv_bfloat16*, int64_t,
                                              int64_t, cudaStream_t);
template void drop_path_launch<__half>(const __half*, const float*, __half*, int64_t, int64_t, cudaStream_t);

}  // namespace rt::cuda
