// The fused SGD update: one block per segment, one pass over params, grads and momentum.
#include "cuda/check.h"
#include "cuda/launch.h"
#include "cuda/sgd_kernel.h"

namespace rt::cuda {
namespace {

// The CPU's sgd_update (nn/optimizer.cc) term by term. The _rn intrinsics forbid FMA contraction,
// which the CPU build (ISO C++, no FMA in baseline x86-64) does not do either, so both round the
// same way. LARS is not supported on the device, so the CPU's factor s is 1 and is left out
// (multiplying by 1 is exact).
template <bool First, bool Nesterov>
__global__ void sgd_kernel(float* __restrict__ p, const float* __restrict__ grad,
                           float* __restrict__ buf, const SgdSegment* __restrict__ segs,
                           float mu, float lr) {
  const SgdSegment s = segs[blockIdx.x];
  const float wd = s.weight_decay;
  for (uint32_t k = threadIdx.x; k < s.count; k += blockDim.x) {
    const uint64_t i = s.begin + k;
    const float g = __fadd_rn(grad[i], __fmul_rn(wd, p[i]));
    const float b = First ? g : __fadd_rn(__fmul_rn(mu, buf[i]), g);
    buf[i] = b;
    const float d = Nesterov ? __fadd_rn(g, __fmul_rn(mu, b)) : b;
    p[i] = __fsub_rn(p[i], __fmul_rn(lr, d));
  }
}

template <bool First, bool Nesterov>
void launch(const SgdStepArgs& a, const SgdSegment* segs, uint32_t n, cudaStream_t stream) {
  sgd_kernel<First, Nesterov><<<n, kThreads, 0, stream>>>(a.params, a.grads, a.momentum, segs,
                                                          a.momentum_coef, a.lr);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void sgd_step_launch(const SgdStepArgs& a, cudaStream_t stream) {
  // gridDim.x allows 2^31 - 1 blocks; launch in pieces beyond that (2^43 elements: never, but
  // cheap to be right).
  constexpr uint64_t kMaxGrid = (uint64_t{1} << 31) - 1;
  for (uint64_t first = 0; first < a.num_segments; first += kMaxGrid) {
    const uint32_t n = uint32_t(a.num_segments - first < kMaxGrid ? a.num_segments - first : kMaxGrid);
    const SgdSegment* segs = a.segments + first;
    if (a.first) {
      if (a.nesterov) launch<true, true>(a, segs, n, stream);
      else launch<true, false>(a, segs, n, stream);
    } else {
      if (a.nesterov) launch<false, true>(a, segs, n, stream);
      else launch<false, false>(a, segs, n, stream);
    }
  }
}

}  // namespace rt::cuda
