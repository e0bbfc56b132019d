// Helpers shared by the 16-bit batch norm's kernel files: lowp_channel_sums.cu (per-channel sums,
// batch statistics) and lowp_bn.cu (apply, backward). Only for inclusion by .cu files.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "cuda/lowp_device.cuh"
#include "cuda/lowp_kernels.h"

namespace rt::cuda::lowp {

// The ReLU after a batch norm is not read back from y in backward: the mask is recomputed from x
// with the forward's own arithmetic (bn_value, one fused multiply-add, then the rounding to T that
// produced y), so backward reads two tensors instead of three and still masks exactly where the
// stored y is not positive.
__device__ inline float bn_value(float x, float mean, float scale, float beta) {
  return __fmaf_rn(x - mean, scale, beta);
}
// Whether y = rn<T>(relu(v)) is positive, i.e. whether the gradient passes the ReLU.
template <class T>
__device__ inline bool bn_passes(float v) {
  return to_f32(rn<T>(relu_value(v))) > 0.0f;
}

// A thread's place on the vector grid: channel group grp (channels [c0, c0 + kVec)) of `groups`,
// rows [r0, r1) of its block's chunk, of which it takes r0 + threadIdx.y, + vec_rows, ...
struct VecPlace {
  int64_t groups, grp, c0, r0, r1;
};
__device__ inline VecPlace vec_place(const ChannelReduceGeom& g) {
  VecPlace p;
  p.groups = g.channels / kVec;
  p.grp = int64_t(blockIdx.x) * g.vec_groups + threadIdx.x;
  p.c0 = p.grp * kVec;
  p.r0 = int64_t(blockIdx.y) * g.rows_per_chunk;
  p.r1 = p.r0 + g.rows_per_chunk < g.rows ? p.r0 + g.rows_per_chunk : g.rows;
  return p;
}

// Whether these buffers (two-byte values) take the vector grid g: its channels a multiple of kVec
// (vec_tiles > 0) and every pointer 16-byte aligned.
inline bool on_vec_grid(const ChannelReduceGeom& g, std::initializer_list<const void*> ptrs) {
  return g.vec_tiles > 0 && whole_vectors(size_t(g.rows * g.channels), 2, ptrs);
}
// The vector grid g: blocks (vec tile, chunk), threads (channel group, row).
inline dim3 vec_grid(const ChannelReduceGeom& g) { return dim3(uint32_t(g.vec_tiles), uint32_t(g.chunks)); }
inline dim3 vec_block(const ChannelReduceGeom& g) { return dim3(uint32_t(g.vec_groups), uint32_t(g.vec_rows)); }

// Channel c's training statistics from its mean and sum of squared deviations as stored (fp32).
__device__ inline void train_stats_of(const BnStatsArgs& a, int64_t c, float mean, float var_sum) {
  const double m = double(a.m);
  const double var = double(var_sum) / m;
  const double invstd = 1.0 / sqrt(var + a.eps);
  a.invstd[c] = float(invstd);
  a.scale[c] = float(double(a.gamma[c]) * invstd);
  a.beta_saved[c] = a.beta[c];
  a.running_mean[c] = float((1.0 - a.momentum) * a.running_mean[c] + a.momentum * double(mean));
  a.running_var[c] = float((1.0 - a.momentum) * a.running_var[c] + a.momentum * var * m / (m - 1.0));
}

}  // namespace rt::cuda::lowp
