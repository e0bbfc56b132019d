// Input normalization on the device: the loader ships 8-bit NHWC pixels (a quarter of the bytes of
// float), the GPU scales them to float/bf16/f16 in the layout the first convolution takes.
#include "cuda/elementwise.cuh"
#include "cuda/kernels.h"

namespace rt::cuda {
namespace {

// One thread per pixel: reads its 3 bytes, writes 3 values. One fused multiply-add, rounded once,
// as the loader's tables (nn/normalize.h, std::fmaf): the device input equals the host's bitwise.
template <class T>
__global__ void normalize_kernel(const uint8_t* in, T* out, int64_t pixels, int64_t hw,
                                 NormalizeParams p) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pixels; i += stride) {
    const uint8_t* px = in + 3 * i;
    for (int c = 0; c < 3; ++c) {
      const float v = __fmaf_rn(float(px[c]), p.scale[c], p.shift[c]);
      // NCHW: image n = i / hw, plane c, position i % hw.
      const int64_t o = p.nchw ? (i / hw * 3 + c) * hw + i % hw : 3 * i + c;
      out[o] = from_f32<T>(v);
    }
  }
}

template <class T>
void launch(const uint8_t* in, void* out, int64_t pixels, int64_t hw, const NormalizeParams& p,
            cudaStream_t stream) {
  normalize_kernel<T><<<grid_for(size_t(pixels)), kThreads, 0, stream>>>(in, static_cast<T*>(out),
                                                                         pixels, hw, p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void normalize_u8(Elem out_type, const uint8_t* in, void* out, int64_t n, int64_t h, int64_t w,
                  const NormalizeParams& p, cudaStream_t stream) {
  if (n < 0 || h < 0 || w < 0)
    throw Error(str_cat("cuda normalize_u8: negative shape ", n, "x", h, "x", w));
  const int64_t pixels = n * h * w;
  if (pixels == 0) return;
  switch (out_type) {
    case Elem::f32: return launch<float>(in, out, pixels, h * w, p, stream);
    case Elem::bf16: return launch<__nv_bfloat16>(in, out, pixels, h * w, p, stream);
    case Elem::f16: return launch<__half>(in, out, pixels, h * w, p, stream);
  }
  throw Error(str_cat("cuda normalize_u8: unknown element type ", int(out_type)));
}

}  // namespace rt::cuda
