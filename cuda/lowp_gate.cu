// Squeeze-and-excitation's channel gate on the 16-bit backends' NHWC activations: fp32
// arithmetic, one rounding to T per stored value; the gate g is (n, c) in T.
#include "cuda/check.h"
#include "cuda/lowp_device.cuh"
#include "cuda/lowp_kernels.h"

namespace rt::cuda {
namespace {

using namespace lowp;

__device__ inline float gate_sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

template <class T>
__global__ void gate_forward_kernel(const T* x, const T* g, T* y, int64_t n, int64_t c, int64_t hw) {
  const int64_t total = n * hw * c;
  for (int64_t i = first_index(); i < total; i += grid_stride())
    y[i] = rn<T>(ld(x, i) * gate_sigmoid(ld(g, (i / (hw * c)) * c + i % c)));
}

template <class T>
__global__ void gate_backward_dx_kernel(const T* g, const T* dy, T* dx, int64_t n, int64_t c, int64_t hw) {
  const int64_t total = n * hw * c;
  for (int64_t i = first_index(); i < total; i += grid_stride())
    dx[i] = rn<T>(ld(dy, i) * gate_sigmoid(ld(g, (i / (hw * c)) * c + i % c)));
}

// One thread per (sample, channel): its hw values are c apart, and neighbouring threads read
// neighbouring channels, so a warp's loads stay together.
template <class T>
__global__ void gate_backward_dg_kernel(const T* x, const T* g, const T* dy, T* dg, int64_t n, int64_t c,
                                        int64_t hw) {
  for (int64_t p = first_index(); p < n * c; p += grid_stride()) {
    const int64_t b = p / c, ch = p % c;
    float dot = 0.0f;
    for (int64_t e = 0; e < hw; ++e) dot += ld(dy, (b * hw + e) * c + ch) * ld(x, (b * hw + e) * c + ch);
    const float s = gate_sigmoid(ld(g, p));
    dg[p] = rn<T>(dot * s * (1.0f - s));
  }
}

}  // namespace

template <class T>
void lowp_gate_forward(const T* x, const T* g, T* y, int64_t n, int64_t c, int64_t hw, cudaStream_t stream) {
  if (n * c * hw <= 0) return;
  gate_forward_kernel<T><<<blocks_for(n * c * hw), kThreads, 0, stream>>>(x, g, y, n, c, hw);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void lowp_gate_backward(const T* x, const T* g, const T* dy, T* dx, T* dg, int64_t n, int64_t c, int64_t hw,
                        cudaStream_t stream) {
  if (n * c * hw <= 0) return;
  // dg first: dx may alias dy.
  gate_backward_dg_kernel<T><<<blocks_for(n * c), kThreads, 0, stream>>>(x, g, dy, dg, n, c, hw);
  CUDA_CHECK_LAUNCH();
  gate_backward_dx_kernel<T><<<blocks_for(n * c * hw), kThreads, 0, stream>>>(g, dy, dx, n, c, hw);
  CUDA_CHECK_LAUNCH();
}

#define RT_LOWP_INSTANTIATE(T)                                                                          \
  template void lowp_gate_forward(const T*, const T*, T*, int64_t, int64_t, int64_t, cudaStream_t);     \
  template void lowp_gate_backward(const T*, const T*, const T*, T*, T*, int64_t, int64_t, int64_t,      \
                                   cudaStream_t);
RT_LOWP_INSTANTIATE(bf16)
RT_LOWP_INSTANTIATE(f16)
#undef RT_LOWP_INSTANTIATE

}  // namespace rt::cuda
