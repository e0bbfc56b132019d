// The ring allreduce's element arithmetic on device buffers: add and scale, fp32 accumulation.
#include "cuda/elementwise.cuh"
#include "cuda/kernels.h"

namespace rt::cuda {
namespace {

struct AddOp {
  __device__ float operator()(float d, float s) const { return d + s; }
};
struct ScaleOp {
  float s;
  __device__ float operator()(float d, float) const { return d * s; }
};

template <class Op>
void dispatch(Elem t, void* dst, const void* src, size_t n, Op op, cudaStream_t stream) {
  switch (t) {
    case Elem::f32:
      return map_launch<float, true>(static_cast<float*>(dst), static_cast<const float*>(src), n,
                                     op, stream);
    case Elem::bf16:
      return map_launch<__nv_bfloat16, true>(static_cast<__nv_bfloat16*>(dst),
                                             static_cast<const __nv_bfloat16*>(src), n, op, stream);
    case Elem::f16:
      return map_launch<__half, true>(static_cast<__half*>(dst), static_cast<const __half*>(src),
                                      n, op, stream);
  }
  throw Error(str_cat("cuda reduce: unknown element type ", int(t)));
}

}  // namespace

void reduce_add(Elem t, void* dst, const void* src, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (!src) throw Error("cuda reduce_add: null source");
  dispatch(t, dst, src, n, AddOp{}, stream);
}

void scale(Elem t, void* buf, size_t n, float s, cudaStream_t stream) {
  if (n == 0) return;
  dispatch(t, buf, nullptr, n, ScaleOp{s}, stream);
}

}  // namespace rt::cuda
