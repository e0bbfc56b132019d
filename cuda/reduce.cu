// The ring allreduce's element arithmetic on device buffers: add and scale, fp32 accumulation;
// the conversions of gradient compression; the weights' moving average.
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
struct EmaOp {
  float w;
  __device__ float operator()(float avg, float x) const { return __fmaf_rn(w, __fsub_rn(x, avg), avg); }
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

// One element per thread, grid-stride: 2- and 4-byte accesses of consecutive threads coalesce.
template <class To, class From>
__global__ void convert_kernel(To* dst, const From* src, uint32_t n, float s) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dst[i] = from_f32<To>(to_f32(src[i]) * s);
}

template <class To, class From>
void convert_launch(void* dst, const void* src, size_t n, float s, cudaStream_t stream) {
  for (const LaunchRange& r : split_launches(n)) {
    convert_kernel<To, From><<<grid_for(r.count), kThreads, 0, stream>>>(
        static_cast<To*>(dst) + r.offset, static_cast<const From*>(src) + r.offset,
        uint32_t(r.count), s);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void convert(Elem to, void* dst, Elem from, const void* src, size_t n, float s,
             cudaStream_t stream) {
  if (n == 0) return;
  if (from == Elem::f32 && to == Elem::bf16)
    return convert_launch<__nv_bfloat16, float>(dst, src, n, s, stream);
  if (from == Elem::f32 && to == Elem::f16) return convert_launch<__half, float>(dst, src, n, s, stream);
  if (from == Elem::bf16 && to == Elem::f32)
    return convert_launch<float, __nv_bfloat16>(dst, src, n, s, stream);
  if (from == Elem::f16 && to == Elem::f32) return convert_launch<float, __half>(dst, src, n, s, stream);
  if (from == Elem::f32 && to == Elem::f32) return convert_launch<float, float>(dst, src, n, s, stream);
  throw Error(str_cat("cuda convert: no conversion from type ", int(from), " to type ", int(to)));
}

void reduce_add(Elem t, void* dst, const void* src, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (!src) throw Error("cuda reduce_add: null source");
  dispatch(t, dst, src, n, AddOp{}, stream);
}

void scale(Elem t, void* buf, size_t n, float s, cudaStream_t stream) {
  if (n == 0) return;
  dispatch(t, buf, nullptr, n, ScaleOp{s}, stream);
}

void ema_update(float* avg, const float* x, size_t n, float w, cudaStream_t stream) {
  if (n == 0) return;
  map_launch<float, true>(avg, x, n, EmaOp{w}, stream);
}

}  // namespace rt::cuda
