// Device helpers shared by the 16-bit backends' kernel files (lowp_kernels.cu, lowp_bn.cu):
// grid-stride indices, element and 16-byte vector loads and stores with fp32 arithmetic and one
// rounding per stored value. Only for inclusion by .cu files.
#pragma once
#include <cstdint>
#include <cstring>

#include "cuda/elementwise.cuh"  // to_f32, from_f32
#include "cuda/lowp_layout.h"    // kVec

namespace rt::cuda::lowp {

__device__ inline int64_t first_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }
__device__ inline float relu_value(float v) { return (v > 0.0f || isnan(v)) ? v : 0.0f; }
template <class T>
__device__ inline float ld(const T* p, int64_t i) { return to_f32(p[i]); }
template <class T>
__device__ inline T rn(float v) { return from_f32<T>(v); }

inline uint32_t blocks_for(int64_t n) { return grid_for(size_t(n)); }

// Vector v: elements [v * kVec, v * kVec + kVec), one 16-byte access. The bytes go through
// element arrays with memcpy, not a cast pointer (see map_kernel in elementwise.cuh).
template <class T>
__device__ inline void load_vec(const T* p, int64_t v, float (&f)[kVec]) {
  static_assert(sizeof(T) * kVec == sizeof(uint4));
  const uint4 u = reinterpret_cast<const uint4*>(p)[v];
  T e[kVec];
  memcpy(static_cast<void*>(e), &u, sizeof u);
#pragma unroll
  for (int k = 0; k < kVec; ++k) f[k] = to_f32(e[k]);
}
template <class T>
__device__ inline void store_vec(T* p, int64_t v, const float (&f)[kVec]) {
  T e[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) e[k] = rn<T>(f[k]);
  uint4 u;
  memcpy(&u, static_cast<const void*>(e), sizeof u);
  reinterpret_cast<uint4*>(p)[v] = u;
}
// Per-channel fp32 parameters of channels [c0, c0 + kVec), once per thread.
__device__ inline void load_channels(const float* p, int64_t c0, float (&f)[kVec]) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) f[k] = p[c0 + k];
}

}  // namespace rt::cuda::lowp
