// The fused SGD update: one block per segment, one pass over params, grads and momentum; with
// LARS, two small passes before it for the trust ratios. AdamW in one pass too; LAMB in three.
#include "cuda/block_reduce.cuh"
#include "cuda/check.h"
#include "cuda/launch.h"
#include "cuda/sgd_kernel.h"

namespace rt::cuda {
namespace {

// LARS, first pass: a warp per segment, each lane summing every 32nd element, then a butterfly
// across the lanes (the CPU's order: lars_chunk_squares, nn/optimizer.h). Neighbouring lanes
// read neighbouring elements, and thousands of warps share the work; a thread per segment would
// walk 16 KiB in 4096 dependent steps with a few warps per multiprocessor. Every segment is
// summed, also those of tensors LARS leaves alone (BN and biases, a tiny part of the arena): the
// grid is then a plain range, and their sums go unread.
__global__ void lars_sums_kernel(const float* __restrict__ p, const float* __restrict__ grad,
                                 const SgdSegment* __restrict__ segs, uint64_t num_segments,
                                 double* __restrict__ sums) {
  const uint64_t j = (uint64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLarsLanes;
  const uint32_t lane = threadIdx.x % kLarsLanes;
  if (j >= num_segments) return;  // the whole warp: blockDim.x is a multiple of 32
  const SgdSegment s = segs[j];
  double w, g;
  lars_lane_sums(p + s.begin, grad + s.begin, s.count, lane, &w, &g);
  w = warp_reduce(w, LarsAdd{});
  g = warp_reduce(g, LarsAdd{});
  if (lane == 0) {
    sums[2 * j] = w;
    sums[2 * j + 1] = g;
  }
}

// LARS's (and LAMB's) second pass: one thread per tensor adds its segments' sums in order and
// writes its factor to each of its segments: LARS's η·‖p‖ / (‖grad‖ + wd·‖p‖ + eps), or LAMB's
// ‖p‖ / ‖u‖ (1 where a norm is 0, as Adam<float> has it).
template <bool Lamb>
__global__ void lars_scale_kernel(const LarsTensor* __restrict__ lars, uint32_t n,
                                  const double* __restrict__ sums, float* __restrict__ scale,
                                  double trust, double eps) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const LarsTensor t = lars[i];
  double w2 = 0, g2 = 0;
  for (uint32_t j = t.first_segment; j < t.first_segment + t.num_segments; ++j) {
    w2 = lars_add(w2, sums[2 * j]);
    g2 = lars_add(g2, sums[2 * j + 1]);
  }
  float s;
  if (Lamb) {
    const double wn = __dsqrt_rn(w2), un = __dsqrt_rn(g2);
    s = wn > 0 && un > 0 ? float(__ddiv_rn(wn, un)) : 1.0f;
  } else {
    s = lars_scale(w2, g2, t.weight_decay, trust, eps);
  }
  for (uint32_t j = t.first_segment; j < t.first_segment + t.num_segments; ++j) scale[j] = s;
}

// The CPU's sgd_update (nn/optimizer.cc) term by term. The _rn intrinsics forbid FMA contraction,
// which the CPU build (ISO C++, no FMA in baseline x86-64) does not do either, so both round the
// same way. Without LARS the CPU's factor s is 1 and is left out (multiplying by 1 is exact).
template <bool First, bool Nesterov, bool Lars>
__global__ void sgd_kernel(float* __restrict__ p, const float* __restrict__ grad,
                           float* __restrict__ buf, const SgdSegment* __restrict__ segs,
                           const float* __restrict__ segment_scale, float mu, double lr_d) {
  const SgdSegment s = segs[blockIdx.x];
  const float wd = s.weight_decay;
  const float lr = float(lars_mul(lr_d, s.lr_mult));
  const float scale = Lars ? segment_scale[blockIdx.x] : 1.0f;
  for (uint32_t k = threadIdx.x; k < s.count; k += blockDim.x) {
    const uint64_t i = s.begin + k;
    float g = __fadd_rn(grad[i], __fmul_rn(wd, p[i]));
    if (Lars) g = __fmul_rn(g, scale);
    const float b = First ? g : __fadd_rn(__fmul_rn(mu, buf[i]), g);
    buf[i] = b;
    const float d = Nesterov ? __fadd_rn(g, __fmul_rn(mu, b)) : b;
    p[i] = __fsub_rn(p[i], __fmul_rn(lr, d));
  }
}

template <bool First, bool Nesterov, bool Lars>
void launch(const SgdStepArgs& a, uint64_t first, uint32_t n, cudaStream_t stream) {
  sgd_kernel<First, Nesterov, Lars><<<n, kThreads, 0, stream>>>(
      a.params, a.grads, a.momentum, a.segments + first, Lars ? a.segment_scale + first : nullptr,
      a.momentum_coef, a.lr_d);
  CUDA_CHECK_LAUNCH();
}

template <bool First, bool Nesterov>
void launch(const SgdStepArgs& a, uint64_t first, uint32_t n, cudaStream_t stream) {
  if (a.num_lars > 0) launch<First, Nesterov, true>(a, first, n, stream);
  else launch<First, Nesterov, false>(a, first, n, stream);
}

// Adam's moments moved to g (in place); returns √v / √(1 − β2^t) + eps. adam.cc's moments().
__device__ inline float adam_moments(float g, float& m, float& v, const SgdStepArgs& a, const SgdStepArgs::Bias& b) {
  m = __fadd_rn(m, __fmul_rn(a.w1, __fsub_rn(g, m)));
  v = __fadd_rn(__fmul_rn(a.b2, v), __fmul_rn(a.w2, __fmul_rn(g, g)));
  return __fadd_rn(__fdiv_rn(__fsqrt_rn(v), b.bc2_root), a.eps);
}

// LAMB's direction from moved moments: adam.cc's lamb_direction().
__device__ inline float lamb_direction(float p, float m, float den, float wd, const SgdStepArgs::Bias& b) {
  return __fadd_rn(__fdiv_rn(__fdiv_rn(m, b.bc1), den), __fmul_rn(wd, p));
}

// AdamW: one block per segment, one pass (adam.cc's adamw_chunk).
__global__ void adamw_kernel(SgdStepArgs a) {
  const SgdSegment s = a.segments[blockIdx.x];
  const SgdStepArgs::Bias& b = a.bias[s.group];
  const double lr_t = lars_mul(a.lr_d, s.lr_mult);
  const float decay = float(lars_add(1.0, -lars_mul(lr_t, double(s.weight_decay))));
  const float step_size = float(__ddiv_rn(lr_t, b.bc1_d));
  for (uint32_t k = threadIdx.x; k < s.count; k += blockDim.x) {
    const uint64_t i = s.begin + k;
    const float q = __fmul_rn(a.params[i], decay);
    float m = a.momentum[i], v = a.second[i];
    const float den = adam_moments(a.grads[i], m, v, a, b);
    a.momentum[i] = m;
    a.second[i] = v;
    a.params[i] = __fsub_rn(q, __fmul_rn(step_size, __fdiv_rn(m, den)));
  }
}

// LAMB, first pass: a warp per segment moves every element's moments (each element is one lane's)
// and sums Σp² and Σu² in the order of lars_sums_kernel (adam.cc: lars_chunk_squares over p, u).
__global__ void lamb_sums_kernel(SgdStepArgs a) {
  const uint64_t j = (uint64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLarsLanes;
  const uint32_t lane = threadIdx.x % kLarsLanes;
  if (j >= a.num_segments) return;
  const SgdSegment s = a.segments[j];
  const SgdStepArgs::Bias& b = a.bias[s.group];
  double w = 0, u2 = 0;
  for (uint32_t k = lane; k < s.count; k += kLarsLanes) {
    const uint64_t i = s.begin + k;
    float m = a.momentum[i], v = a.second[i];
    const float den = adam_moments(a.grads[i], m, v, a, b);
    a.momentum[i] = m;
    a.second[i] = v;
    const float p = a.params[i], u = lamb_direction(p, m, den, s.weight_decay, b);
    w = lars_add(w, lars_mul(double(p), double(p)));
    u2 = lars_add(u2, lars_mul(double(u), double(u)));
  }
  w = warp_reduce(w, LarsAdd{});
  u2 = warp_reduce(u2, LarsAdd{});
  if (lane == 0) {
    a.lars_sums[2 * j] = w;
    a.lars_sums[2 * j + 1] = u2;
  }
}

// LAMB, the update: the direction again from the moved moments, scaled by the segment's ratio.
__global__ void lamb_apply_kernel(SgdStepArgs a) {
  const SgdSegment s = a.segments[blockIdx.x];
  const SgdStepArgs::Bias& b = a.bias[s.group];
  const float ratio = a.segment_scale[blockIdx.x];
  const float lr = float(lars_mul(a.lr_d, s.lr_mult));
  for (uint32_t k = threadIdx.x; k < s.count; k += blockDim.x) {
    const uint64_t i = s.begin + k;
    const float v = a.second[i], p = a.params[i];
    const float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), b.bc2_root), a.eps);
    a.params[i] = __fsub_rn(p, __fmul_rn(lr, __fmul_rn(ratio, lamb_direction(p, a.momentum[i], den, s.weight_decay, b))));
  }
}

void adam_step_launch(const SgdStepArgs& a, cudaStream_t stream) {
  constexpr uint64_t kMaxGrid = (uint64_t{1} << 31) - 1;
  if (a.adam == 2) {
    constexpr uint64_t kPerBlock = kThreads / kLarsLanes;
    const uint64_t blocks = (a.num_segments + kPerBlock - 1) / kPerBlock;
    if (blocks > 0) {
      lamb_sums_kernel<<<uint32_t(blocks), kThreads, 0, stream>>>(a);
      CUDA_CHECK_LAUNCH();
    }
    if (a.num_lars > 0) {
      lars_scale_kernel<true><<<(a.num_lars + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
          a.lars, a.num_lars, a.lars_sums, a.segment_scale, 0, 0);
      CUDA_CHECK_LAUNCH();
    }
  }
  // Block b of a launch reads segment b: each piece of the grid gets its segments' slice.
  for (uint64_t first = 0; first < a.num_segments; first += kMaxGrid) {
    const uint32_t n = uint32_t(a.num_segments - first < kMaxGrid ? a.num_segments - first : kMaxGrid);
    SgdStepArgs piece = a;
    piece.segments = a.segments + first;
    if (a.segment_scale) piece.segment_scale = a.segment_scale + first;
    if (a.adam == 2) lamb_apply_kernel<<<n, kThreads, 0, stream>>>(piece);
    else adamw_kernel<<<n, kThreads, 0, stream>>>(piece);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void sgd_step_launch(const SgdStepArgs& a, cudaStream_t stream) {
  if (a.adam != 0) {
    adam_step_launch(a, stream);
    return;
  }
  // gridDim.x allows 2^31 - 1 blocks; launch in pieces beyond that (2^43 elements: never, but
  // cheap to be right).
  constexpr uint64_t kMaxGrid = (uint64_t{1} << 31) - 1;
  if (a.num_lars > 0) {
    // A warp per segment, 8 per block: the grid's limit is 2^34 segments, 2^46 elements, far
    // beyond any device's memory.
    constexpr uint64_t kPerBlock = kThreads / kLarsLanes;
    static_assert(kThreads % kLarsLanes == 0, "whole warps per block");
    const uint64_t blocks = (a.num_segments + kPerBlock - 1) / kPerBlock;
    lars_sums_kernel<<<uint32_t(blocks), kThreads, 0, stream>>>(a.params, a.grads, a.segments,
                                                                a.num_segments, a.lars_sums);
    CUDA_CHECK_LAUNCH();
    lars_scale_kernel<false><<<(a.num_lars + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        a.lars, a.num_lars, a.lars_sums, a.segment_scale, a.lars_trust, a.lars_eps);
    CUDA_CHECK_LAUNCH();
  }
  for (uint64_t first = 0; first < a.num_segments; first += kMaxGrid) {
    const uint32_t n = uint32_t(a.num_segments - first < kMaxGrid ? a.num_segments - first : kMaxGrid);
    if (a.first) {
      if (a.nesterov) launch<true, true>(a, first, n, stream);
      else launch<true, false>(a, first, n, stream);
    } else {
      if (a.nesterov) launch<false, true>(a, first, n, stream);
      else launch<false, false>(a, first, n, stream);
    }
  }
}

}  // namespace rt::cuda
