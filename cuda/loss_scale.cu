// Loss-scaling support: detect inf/NaN in gradients (overflow of the scaled loss) and unscale them.
#include "cuda/elementwise.cuh"
#include "cuda/kernels.h"

namespace rt::cuda {
namespace {

// A plain store of 1 by any number of threads is race-free in effect: all write the same value.
struct CheckOp {
  int* flag;
  __device__ float operator()(float d, float) const {
    if (!isfinite(d)) *flag = 1;
    return d;
  }
};
struct UnscaleCheckOp {
  int* flag;
  float inv;
  // The product is checked, as the host backends count after scaling: a factor above 1 (a loss
  // scale below 1) can carry a finite gradient past the largest float.
  __device__ float operator()(float d, float) const {
    const float r = d * inv;
    if (!isfinite(r)) *flag = 1;
    return r;
  }
};

template <bool Write, class Op>
void dispatch(Elem t, void* buf, size_t n, Op op, cudaStream_t stream) {
  switch (t) {
    case Elem::f32:
      return map_launch<float, Write>(static_cast<float*>(buf), nullptr, n, op, stream);
    case Elem::bf16:
      return map_launch<__nv_bfloat16, Write>(static_cast<__nv_bfloat16*>(buf), nullptr, n, op,
                                              stream);
    case Elem::f16:
      return map_launch<__half, Write>(static_cast<__half*>(buf), nullptr, n, op, stream);
  }
  throw Error(str_cat("cuda loss scale: unknown element type ", int(t)));
}

}  // namespace

void nonfinite_check(Elem t, const void* buf, size_t n, int* flag, cudaStream_t stream) {
  if (n == 0) return;
  // Read-only: map_kernel<..., Write = false> never stores through the pointer.
  dispatch<false>(t, const_cast<void*>(buf), n, CheckOp{flag}, stream);
}

void unscale_check(Elem t, void* buf, size_t n, float inv_scale, int* flag, cudaStream_t stream) {
  if (n == 0) return;
  dispatch<true>(t, buf, n, UnscaleCheckOp{flag, inv_scale}, stream);
}

}  // namespace rt::cuda
