// Device helpers shared by the 16-bit backends' kernel files (lowp_kernels.cu, lowp_bn.cu,
// lowp_channel_sums.cu): grid-stride indices, element and 16-byte vector loads and stores with
// fp32 arithmetic and one rounding per stored value. Only for inclusion by .cu files.
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
__device__ inline uint4 load_raw(const T* p, int64_t v) {
  static_assert(sizeof(T) * kVec == sizeof(uint4));
  return reinterpret_cast<const uint4*>(p)[v];
}
template <class T>
__device__ inline void widen(const uint4& u, float (&f)[kVec]) {
  T e[kVec];
  memcpy(static_cast<void*>(e), &u, sizeof u);
#pragma unroll
  for (int k = 0; k < kVec; ++k) f[k] = to_f32(e[k]);
}
template <class T>
__device__ inline void load_vec(const T* p, int64_t v, float (&f)[kVec]) {
  widen<T>(load_raw(p, v), f);
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
// A ReLU's backward: dy where y is positive (dy's own bits, no rounding), else zero (NaN y
// included); per value, and per 16-byte vector of each.
template <class T>
__device__ inline T relu_masked(T y, T dy) {
  return to_f32(y) > 0.0f ? dy : from_f32<T>(0.0f);
}
template <class T>
__device__ inline uint4 relu_masked(const uint4& y, const uint4& dy) {
  T ey[kVec], ed[kVec];
  memcpy(static_cast<void*>(ey), &y, sizeof y);
  memcpy(static_cast<void*>(ed), &dy, sizeof dy);
#pragma unroll
  for (int k = 0; k < kVec; ++k) ed[k] = relu_masked(ey[k], ed[k]);
  uint4 out;
  memcpy(&out, static_cast<const void*>(ed), sizeof out);
  return out;
}

// Rows first, first + step, ... below end, B at a time: load(j, r) puts row r in slot j for the
// whole batch first, so that its loads are all in flight at once (a loop the compiler unrolls
// keeps an exit test before each copy's loads: one row in flight per thread), then use(j, r)
// takes them in row order, so sums keep their order. The rest one by one in slot 0. Four rows of
// one tensor, or two of two (kRowBatch2): 64 bytes in flight per thread within 128 registers.
constexpr int kRowBatch = 4;
constexpr int kRowBatch2 = 2;
template <int B, class Load, class Use>
__device__ inline void batched_rows(int64_t first, int64_t end, int64_t step, Load&& load,
                                    Use&& use) {
  int64_t r = first;
  for (; r + (B - 1) * step < end; r += B * step) {
#pragma unroll
    for (int j = 0; j < B; ++j) load(j, r + j * step);
#pragma unroll
    for (int j = 0; j < B; ++j) use(j, r + j * step);
  }
  for (; r < end; r += step) {
    load(0, r);
    use(0, r);
  }
}

// Per-channel fp32 parameters of channels [c0, c0 + kVec), once per thread.
__device__ inline void load_channels(const float* p, int64_t c0, float (&f)[kVec]) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) f[k] = p[c0 + k];
}

}  // namespace rt::cuda::lowp
