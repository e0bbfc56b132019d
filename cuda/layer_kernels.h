// Launchers of the backend's small layer kernels (ReLU, residual add, pooling, SE gate, padded
// shortcut, ECA's channel convolution), fp32 NCHW, callable from host C++ (C++17-clean: nvcc
// includes it too). All pointers are device pointers; every call is asynchronous on `stream`.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace rt::cuda {

// y = relu(x), NaN propagating as in PyTorch.
void relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream);
// dx = y > 0 ? dy : 0 (the mask from the output, as torch's threshold_backward). dx may alias dy.
void relu_backward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t stream);
// y = a + b, then relu when asked.
void add_forward(const float* a, const float* b, float* y, int64_t n, bool relu,
                 cudaStream_t stream);

struct PoolGeom {
  int64_t planes = 0;  // n * c
  int64_t h = 0, w = 0, out_h = 0, out_w = 0;
  int64_t kernel = 1, stride = 1, pad = 0;
};
// Max pooling with padding as -inf; argmax (in-plane input index per output) is written when
// non-null. Rows then columns, replacing only on a strictly larger value or NaN: ties go to
// the first maximum in window order.
void maxpool_forward(const float* x, float* y, int32_t* argmax, const PoolGeom& g,
                     cudaStream_t stream);
// dx from dy and the forward's argmax, as a gather: each input element sums, in output order,
// dy of the windows whose maximum it was (deterministic, no atomics).
void maxpool_backward(const int32_t* argmax, const float* dy, float* dx, const PoolGeom& g,
                      cudaStream_t stream);
// Windowed average pooling (AvgPoolDesc): each output the mean of the input elements its window
// covers, padding and the part past the input not counted; out_h and out_w from the desc (ceil_mode
// is in them). Forward sums in double in window order and rounds once; backward is a gather: each
// input element sums in fp32, in output order, float(dy / count) of the windows that contain it
// (deterministic, no atomics; the reference's sums in the reference's order).
void window_avgpool_forward(const float* x, float* y, const PoolGeom& g, cudaStream_t stream);
void window_avgpool_backward(const float* dy, float* dx, const PoolGeom& g, cudaStream_t stream);
// y[p] = mean of plane p (summed in double, one thread per plane).
void avgpool_forward(const float* x, float* y, int64_t planes, int64_t hw, cudaStream_t stream);
void avgpool_backward(const float* dy, float* dx, int64_t planes, int64_t hw, cudaStream_t stream);

// Squeeze-and-excitation's gate on planes of hw values: y = x * sigmoid(g[plane]); backward
// dx = dy * s and dg[plane] = s (1 - s) * (sum of dy * x over the plane, in double; a warp per
// plane). dx may alias dy.
void gate_forward(const float* x, const float* g, float* y, int64_t planes, int64_t hw, cudaStream_t stream);
void gate_backward(const float* x, const float* g, const float* dy, float* dx, float* dg, int64_t planes,
                   int64_t hw, cudaStream_t stream);

// ECA's channel convolution (ChannelConvDesc) on `rows` rows of c values, c apart (an (n, c, 1, 1)
// tensor in NCHW and in NHWC alike), for T = float and, for the 16-bit backends, bf16 and f16; the
// weights w and their gradient dw are fp32 (the arena). y and dx: per output one double sum over
// the taps in order, as the host reference sums (a product of two floats is exact in double, so
// fused or not, the same bits), rounded to float, and for 16-bit T then to T: the reference's
// result, rounded. dw[j] sums dy[r][i] x[r][i + j - p] over the rows and channels in double, a
// block per tap in a fixed order (the same bits every run), and is overwritten. dx is skipped when
// null; no buffer may alias another.
struct ChannelConvGeom {
  int64_t rows = 0, c = 0, kernel = 1;
};
template <class T>
void channel_conv_forward(const T* x, const float* w, T* y, const ChannelConvGeom& g, cudaStream_t stream);
template <class T>
void channel_conv_backward(const T* x, const float* w, const T* dy, T* dx, float* dw, const ChannelConvGeom& g,
                           cudaStream_t stream);

struct ShortcutGeom {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input
  int64_t out_c = 0, out_h = 0, out_w = 0, stride = 1;
  int64_t before = 0;  // zero channels ahead of the copied ones
};
void pad_shortcut_forward(const float* x, float* y, const ShortcutGeom& g, cudaStream_t stream);
void pad_shortcut_backward(const float* dy, float* dx, const ShortcutGeom& g, cudaStream_t stream);

}  // namespace rt::cuda
