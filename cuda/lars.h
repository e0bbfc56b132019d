// LARS trust ratios on the device in the CPU optimizer's exact arithmetic (Sgd<T> in
// nn/optimizer.h), shared by the kernels and their host tests: per segment, Σp² and Σgrad² in
// double in lars_chunk_squares' order (lane l sums elements l, l + 32, ... in order; the
// kernel's butterfly of shuffles then adds lane l + 16 to lane l, then l + 8, + 4, + 2, + 1);
// per tensor, its segments' sums in order, then s = η·‖p‖ / (‖grad‖ + wd·‖p‖ + eps), or 1 where
// a norm is 0, rounded once to float. The device forms are _rn intrinsics, which forbid FMA
// contraction; the host build (-ffp-contract=off, set for every C++ source) does not contract
// either, so both round alike. C++17-clean (nvcc includes it).
#pragma once
#include <cmath>
#include <cstdint>

#include "cuda/launch.h"  // RT_HOST_DEVICE

namespace rt::cuda {

// A tensor LARS scales: its run of SGD segments (sgd_segments' order) and weight decay.
struct LarsTensor {
  uint32_t first_segment = 0;
  uint32_t num_segments = 0;
  float weight_decay = 0;
};

RT_HOST_DEVICE inline double lars_add(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
RT_HOST_DEVICE inline double lars_mul(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

constexpr uint32_t kLarsLanes = 32;  // a warp: one segment's partial sums
static_assert(kLarsLanes == 32, "the kernels add a segment's lanes with warp_reduce, a whole warp");
// lars_add as a function object, for warp_reduce (cuda/block_reduce.cuh: the butterfly above).
struct LarsAdd {
  RT_HOST_DEVICE double operator()(double a, double b) const { return lars_add(a, b); }
};

// Lane `lane`'s share of Σp² and Σgrad² over [0, n): elements lane, lane + 32, ..., in order.
// Neighbouring lanes read neighbouring elements, so a warp's loads are whole cache lines.
RT_HOST_DEVICE inline void lars_lane_sums(const float* p, const float* grad, uint32_t n,
                                          uint32_t lane, double* w2, double* g2) {
  double w = 0, g = 0;
  for (uint32_t i = lane; i < n; i += kLarsLanes) {
    w = lars_add(w, lars_mul(double(p[i]), double(p[i])));
    g = lars_add(g, lars_mul(double(grad[i]), double(grad[i])));
  }
  *w2 = w;
  *g2 = g;
}

// The trust ratio from a tensor's summed squares, in double (the CPU's trust_ratios()).
RT_HOST_DEVICE inline double lars_ratio(double w2, double g2, float weight_decay, double trust,
                                        double eps) {
#ifdef __CUDA_ARCH__
  const double wn = __dsqrt_rn(w2), gn = __dsqrt_rn(g2);
#else
  const double wn = std::sqrt(w2), gn = std::sqrt(g2);
#endif
  if (!(wn > 0 && gn > 0)) return 1.0;  // also NaN: the plain global lr, as the CPU
  const double den = lars_add(lars_add(gn, lars_mul(double(weight_decay), wn)), eps);
#ifdef __CUDA_ARCH__
  return __ddiv_rn(lars_mul(trust, wn), den);
#else
  return lars_mul(trust, wn) / den;
#endif
}

// ... rounded once to float, as the update uses it.
RT_HOST_DEVICE inline float lars_scale(double w2, double g2, float weight_decay, double trust,
                                       double eps) {
  return float(lars_ratio(w2, g2, weight_decay, trust, eps));
}

}  // namespace rt::cuda
