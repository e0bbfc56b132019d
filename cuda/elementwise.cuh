// Element-wise device kernels over f32, bf16 and f16 storage (arithmetic in fp32): 16-byte vector
// accesses where the pointers allow, a scalar tail, launches split by cuda/launch.h.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "cuda/check.h"
#include "cuda/launch.h"

namespace rt::cuda {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
// Round to nearest even, as the CPU's to_bf16.
template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

// dst[i] = op(dst[i], src[i]) (or op(dst[i], 0) without src) in fp32, stored back when Write.
// Elements [0, vectors * W) go as 16-byte vectors, the tail [vectors * W, n) one per thread.
template <class T, int W, bool Write, class Op>
__global__ void map_kernel(T* dst, const T* src, uint32_t vectors, uint32_t n, Op op) {
  auto one = [&](uint32_t i) {
    const float r = op(to_f32(dst[i]), src ? to_f32(src[i]) : 0.0f);
    if constexpr (Write) dst[i] = from_f32<T>(r);
  };
  auto vec = [&](uint32_t v) {
    if constexpr (W == 1) {
      one(v);
    } else {
      // The 16-byte vectors are copied into element arrays, not read through a cast pointer:
      // elements written through a T* into a uint4 are invisible to a later read of the uint4
      // under strict aliasing (a host compiler dropped them). The copies compile to register moves.
      static_assert(sizeof(T) * W == sizeof(uint4));
      uint4 a = reinterpret_cast<const uint4*>(dst)[v];
      uint4 b = src ? reinterpret_cast<const uint4*>(src)[v] : uint4{0, 0, 0, 0};
      T ea[W], eb[W];
      memcpy(static_cast<void*>(ea), &a, sizeof a);  // void*: T is trivially copyable
      memcpy(static_cast<void*>(eb), &b, sizeof b);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float r = op(to_f32(ea[k]), src ? to_f32(eb[k]) : 0.0f);
        if constexpr (Write) ea[k] = from_f32<T>(r);
      }
      if constexpr (Write) {
        memcpy(&a, ea, sizeof a);
        reinterpret_cast<uint4*>(dst)[v] = a;
      }
    }
  };
  map_thread(blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x, vectors, W, n, vec,
             one);
}

// Runs map_kernel over n elements on `stream`, one launch per kMaxLaunchElems.
template <class T, bool Write, class Op>
void map_launch(T* dst, const T* src, size_t n, Op op, cudaStream_t stream) {
  const int width = vec_width(sizeof(T), {dst, src ? static_cast<const void*>(src) : nullptr});
  for (const LaunchRange& r : split_launches(n)) {
    const VecSplit s = vec_split(r.count, width);
    const uint32_t grid = grid_for(s.vectors);
    T* d = dst + r.offset;
    const T* x = src ? src + r.offset : nullptr;
    if (width == 1)
      map_kernel<T, 1, Write><<<grid, kThreads, 0, stream>>>(d, x, uint32_t(s.vectors),
                                                              uint32_t(r.count), op);
    else
      map_kernel<T, int(kVecBytes / sizeof(T)), Write>
          <<<grid, kThreads, 0, stream>>>(d, x, uint32_t(s.vectors), uint32_t(r.count), op);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace rt::cuda
