// The backend's small layer kernels: one thread per output element (ReLU and add: per four, where
// aligned), grid-stride loops, 64-bit indices (activations of a large batch exceed 2^31 elements in no layer here, but the loops
// cost nothing extra for being safe). ECA's channel convolution kernels serve the 16-bit backends too.
#include "cuda/block_reduce.cuh"
#include "cuda/check.h"
#include "cuda/elementwise.cuh"  // to_f32, from_f32: the channel convolution's storage types
#include "cuda/launch.h"
#include "cuda/layer_kernels.h"

namespace rt::cuda {
namespace {

__device__ inline int64_t first_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }
__device__ inline float relu_value(float v) { return (v > 0.0f || isnan(v)) ? v : 0.0f; }

uint32_t blocks_for(int64_t n) { return grid_for(size_t(n)); }

__global__ void relu_forward_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = relu_value(x[i]);
}

__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

__global__ void add_forward_kernel(const float* a, const float* b, float* y, int64_t n, bool relu) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float s = a[i] + b[i];
    y[i] = relu ? relu_value(s) : s;
  }
}

// The same three on float4 where n is a multiple of 4 and every buffer 16-byte aligned (the
// usual case: activations are whole allocations); one 16-byte access per four values.
__device__ inline float4 relu4(float4 v) {
  return make_float4(relu_value(v.x), relu_value(v.y), relu_value(v.z), relu_value(v.w));
}

__global__ void relu_forward_vec_kernel(const float4* x, float4* y, int64_t vectors) {
  for (int64_t i = first_index(); i < vectors; i += grid_stride()) y[i] = relu4(x[i]);
}

__global__ void relu_backward_vec_kernel(const float4* y, const float4* dy, float4* dx,
                                         int64_t vectors) {
  for (int64_t i = first_index(); i < vectors; i += grid_stride()) {
    const float4 a = y[i], d = dy[i];
    dx[i] = make_float4(a.x > 0.0f ? d.x : 0.0f, a.y > 0.0f ? d.y : 0.0f, a.z > 0.0f ? d.z : 0.0f,
                        a.w > 0.0f ? d.w : 0.0f);
  }
}

__global__ void add_forward_vec_kernel(const float4* a, const float4* b, float4* y, int64_t vectors,
                                       bool relu) {
  for (int64_t i = first_index(); i < vectors; i += grid_stride()) {
    const float4 p = a[i], q = b[i];
    const float4 s = make_float4(p.x + q.x, p.y + q.y, p.z + q.z, p.w + q.w);
    y[i] = relu ? relu4(s) : s;
  }
}

bool vec4_ok(int64_t n, std::initializer_list<const void*> ps) {
  return whole_vectors(size_t(n), sizeof(float), ps);
}

__global__ void maxpool_forward_kernel(const float* x, float* y, int32_t* argmax, PoolGeom g) {
  const int64_t outs = g.planes * g.out_h * g.out_w;
  for (int64_t q = first_index(); q < outs; q += grid_stride()) {
    const int64_t ow = q % g.out_w, oh = (q / g.out_w) % g.out_h, pl = q / (g.out_w * g.out_h);
    const float* xp = x + pl * g.h * g.w;
    float best = -INFINITY;
    int64_t best_i = -1;
    for (int64_t i = 0; i < g.kernel; ++i) {
      const int64_t ih = oh * g.stride - g.pad + i;
      if (ih < 0 || ih >= g.h) continue;
      for (int64_t j = 0; j < g.kernel; ++j) {
        const int64_t iw = ow * g.stride - g.pad + j;
        if (iw < 0 || iw >= g.w) continue;
        const float v = xp[ih * g.w + iw];
        if (best_i < 0 || v > best || isnan(v)) {
          best = v;
          best_i = ih * g.w + iw;
        }
      }
    }
    y[q] = best;
    if (argmax) argmax[q] = int32_t(best_i);
  }
}

// Outputs whose window covers input row ih: oh * stride - pad <= ih < oh * stride - pad + kernel.
__device__ inline void window_range(int64_t i, int64_t kernel, int64_t stride, int64_t pad,
                                    int64_t out, int64_t* lo, int64_t* hi) {
  const int64_t t = i + pad - kernel + 1;  // smallest oh * stride allowed
  *lo = t <= 0 ? 0 : (t + stride - 1) / stride;
  const int64_t h = (i + pad) / stride + 1;
  *hi = h < out ? h : out;
}

__global__ void maxpool_backward_kernel(const int32_t* argmax, const float* dy, float* dx,
                                        PoolGeom g) {
  const int64_t ins = g.planes * g.h * g.w;
  for (int64_t e = first_index(); e < ins; e += grid_stride()) {
    const int64_t iw = e % g.w, ih = (e / g.w) % g.h, pl = e / (g.w * g.h);
    const int32_t self = int32_t(ih * g.w + iw);
    int64_t oh0, oh1, ow0, ow1;
    window_range(ih, g.kernel, g.stride, g.pad, g.out_h, &oh0, &oh1);
    window_range(iw, g.kernel, g.stride, g.pad, g.out_w, &ow0, &ow1);
    const int64_t base = pl * g.out_h * g.out_w;
    float s = 0.0f;
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t q = base + oh * g.out_w + ow;
        if (argmax[q] == self) s += dy[q];
      }
    dx[e] = s;
  }
}

// Window o's span [lo, hi) of a dimension of length len, clipped to the input: what average
// pooling counts (padding and, with ceil_mode, the part past the input are not elements).
__device__ inline void clipped_window(int64_t o, int64_t kernel, int64_t stride, int64_t pad,
                                      int64_t len, int64_t* lo, int64_t* hi) {
  const int64_t start = o * stride - pad, end = start + kernel;
  *lo = start < 0 ? 0 : start;
  *hi = end < len ? end : len;
}

__global__ void window_avgpool_forward_kernel(const float* x, float* y, PoolGeom g) {
  const int64_t outs = g.planes * g.out_h * g.out_w;
  for (int64_t q = first_index(); q < outs; q += grid_stride()) {
    const int64_t ow = q % g.out_w, oh = (q / g.out_w) % g.out_h, pl = q / (g.out_w * g.out_h);
    const float* xp = x + pl * g.h * g.w;
    int64_t h0, h1, w0, w1;
    clipped_window(oh, g.kernel, g.stride, g.pad, g.h, &h0, &h1);
    clipped_window(ow, g.kernel, g.stride, g.pad, g.w, &w0, &w1);
    double s = 0;
    for (int64_t ih = h0; ih < h1; ++ih)
      for (int64_t iw = w0; iw < w1; ++iw) s += xp[ih * g.w + iw];
    y[q] = float(s / double((h1 - h0) * (w1 - w0)));
  }
}

// Each term is rounded to float before it is added, as the reference scatters it.
__global__ void window_avgpool_backward_kernel(const float* dy, float* dx, PoolGeom g) {
  const int64_t ins = g.planes * g.h * g.w;
  for (int64_t e = first_index(); e < ins; e += grid_stride()) {
    const int64_t iw = e % g.w, ih = (e / g.w) % g.h, pl = e / (g.w * g.h);
    int64_t oh0, oh1, ow0, ow1;
    window_range(ih, g.kernel, g.stride, g.pad, g.out_h, &oh0, &oh1);
    window_range(iw, g.kernel, g.stride, g.pad, g.out_w, &ow0, &ow1);
    const float* dyp = dy + pl * g.out_h * g.out_w;
    float s = 0.0f;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      int64_t h0, h1;
      clipped_window(oh, g.kernel, g.stride, g.pad, g.h, &h0, &h1);
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        int64_t w0, w1;
        clipped_window(ow, g.kernel, g.stride, g.pad, g.w, &w0, &w1);
        s += float(double(dyp[oh * g.out_w + ow]) / double((h1 - h0) * (w1 - w0)));
      }
    }
    dx[e] = s;
  }
}

// A warp per plane (a plane's hw values are contiguous in NCHW: one thread per plane would read
// them hw floats apart across the warp): lane l adds elements l, l + 32, ... in double, then the
// lanes' sums add in a fixed butterfly, so every run gives the same bits.
__global__ void avgpool_forward_kernel(const float* x, float* y, int64_t planes, int64_t hw) {
  const int lane = int(threadIdx.x % 32);
  const int64_t warps = grid_stride() / 32;
  for (int64_t p = first_index() / 32; p < planes; p += warps) {  // the same p across the warp
    double s = 0;
    for (int64_t e = lane; e < hw; e += 32) s += x[p * hw + e];
    s = warp_reduce(s, SumOp{});
    if (lane == 0) y[p] = float(s / double(hw));
  }
}

__global__ void avgpool_backward_kernel(const float* dy, float* dx, int64_t planes, int64_t hw) {
  const int64_t n = planes * hw;
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dx[i] = float(double(dy[i / hw]) / double(hw));
}

__device__ inline float gate_sigmoid(float g) { return float(1.0 / (1.0 + exp(-double(g)))); }

__global__ void gate_forward_kernel(const float* x, const float* g, float* y, int64_t planes, int64_t hw) {
  const int64_t n = planes * hw;
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = x[i] * gate_sigmoid(g[i / hw]);
}

__global__ void gate_backward_kernel(const float* x, const float* g, const float* dy, float* dx, float* dg,
                                     int64_t planes, int64_t hw) {
  const int lane = int(threadIdx.x % 32);
  const int64_t warps = grid_stride() / 32;
  for (int64_t p = first_index() / 32; p < planes; p += warps) {  // the same p across the warp
    const float s = gate_sigmoid(g[p]);
    double dot = 0;
    for (int64_t e = lane; e < hw; e += 32) {
      const int64_t i = p * hw + e;
      const float d = dy[i];
      dot += double(d) * double(x[i]);
      dx[i] = d * s;
    }
    dot = warp_reduce(dot, SumOp{});
    if (lane == 0) dg[p] = float(dot * double(s) * (1.0 - double(s)));
  }
}

__global__ void pad_shortcut_forward_kernel(const float* x, float* y, ShortcutGeom g) {
  const int64_t n = g.n * g.out_c * g.out_h * g.out_w;
  for (int64_t q = first_index(); q < n; q += grid_stride()) {
    const int64_t ow = q % g.out_w, oh = (q / g.out_w) % g.out_h;
    const int64_t oc = (q / (g.out_w * g.out_h)) % g.out_c, b = q / (g.out_w * g.out_h * g.out_c);
    const int64_t c = oc - g.before;
    y[q] = (c < 0 || c >= g.c) ? 0.0f
                               : x[((b * g.c + c) * g.h + oh * g.stride) * g.w + ow * g.stride];
  }
}

__global__ void pad_shortcut_backward_kernel(const float* dy, float* dx, ShortcutGeom g) {
  const int64_t n = g.n * g.c * g.h * g.w;
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    const int64_t iw = e % g.w, ih = (e / g.w) % g.h;
    const int64_t c = (e / (g.w * g.h)) % g.c, b = e / (g.w * g.h * g.c);
    const bool kept = ih % g.stride == 0 && iw % g.stride == 0;
    dx[e] = kept ? dy[((b * g.out_c + c + g.before) * g.out_h + ih / g.stride) * g.out_w +
                      iw / g.stride]
                 : 0.0f;
  }
}

// ECA's channel convolution. out[r][i] = sum over the taps j, in order, of w[j] in[r][i + dir (j - p)]
// (zero outside the row): the forward (dir 1) and dx, its transpose (dir -1: the kernel reversed).
template <class T>
__global__ void channel_mix_kernel(const T* in, const float* w, T* out, ChannelConvGeom g, int dir) {
  const int64_t p = (g.kernel - 1) / 2, n = g.rows * g.c;
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    const int64_t i = e % g.c;
    const T* row = in + (e - i);
    double s = 0;
    for (int64_t j = 0; j < g.kernel; ++j) {
      const int64_t src = i + dir * (j - p);
      if (src >= 0 && src < g.c) s += double(w[j]) * double(to_f32(row[src]));
    }
    out[e] = from_f32<T>(float(s));
  }
}

// Only `kernel` blocks: the widest block keeps the most loads in flight.
constexpr int kTapThreads = 1024;

// Block j: dw[j] = the sum of dy[e] x[e + j - p] over the flattened elements e = r c + i whose
// source channel i + j - p lies in the row. Thread t takes e = t, t + blockDim.x, ... and
// block_reduce adds the threads' sums in a fixed tree.
template <class T>
__global__ void channel_conv_dw_kernel(const T* x, const T* dy, float* dw, ChannelConvGeom g) {
  __shared__ double scratch[32];
  const int64_t off = int64_t(blockIdx.x) - (g.kernel - 1) / 2, n = g.rows * g.c;
  double s = 0;
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
    const int64_t src = e % g.c + off;
    if (src >= 0 && src < g.c) s += double(to_f32(dy[e])) * double(to_f32(x[e + off]));
  }
  s = block_reduce(s, SumOp{}, 0.0, scratch);
  if (threadIdx.x == 0) dw[blockIdx.x] = float(s);
}

}  // namespace

void relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (vec4_ok(n, {x, y}))
    relu_forward_vec_kernel<<<blocks_for(n / 4), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(y), n / 4);
  else
    relu_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  CUDA_CHECK_LAUNCH();
}

void relu_backward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (vec4_ok(n, {y, dy, dx}))
    relu_backward_vec_kernel<<<blocks_for(n / 4), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(y), reinterpret_cast<const float4*>(dy),
        reinterpret_cast<float4*>(dx), n / 4);
  else
    relu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, dy, dx, n);
  CUDA_CHECK_LAUNCH();
}

void add_forward(const float* a, const float* b, float* y, int64_t n, bool relu,
                 cudaStream_t stream) {
  if (n <= 0) return;
  if (vec4_ok(n, {a, b, y}))
    add_forward_vec_kernel<<<blocks_for(n / 4), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(a), reinterpret_cast<const float4*>(b),
        reinterpret_cast<float4*>(y), n / 4, relu);
  else
    add_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, b, y, n, relu);
  CUDA_CHECK_LAUNCH();
}

void maxpool_forward(const float* x, float* y, int32_t* argmax, const PoolGeom& g,
                     cudaStream_t stream) {
  const int64_t outs = g.planes * g.out_h * g.out_w;
  if (outs <= 0) return;
  maxpool_forward_kernel<<<blocks_for(outs), kThreads, 0, stream>>>(x, y, argmax, g);
  CUDA_CHECK_LAUNCH();
}

void maxpool_backward(const int32_t* argmax, const float* dy, float* dx, const PoolGeom& g,
                      cudaStream_t stream) {
  const int64_t ins = g.planes * g.h * g.w;
  if (ins <= 0) return;
  maxpool_backward_kernel<<<blocks_for(ins), kThreads, 0, stream>>>(argmax, dy, dx, g);
  CUDA_CHECK_LAUNCH();
}

void window_avgpool_forward(const float* x, float* y, const PoolGeom& g, cudaStream_t stream) {
  const int64_t outs = g.planes * g.out_h * g.out_w;
  if (outs <= 0) return;
  window_avgpool_forward_kernel<<<blocks_for(outs), kThreads, 0, stream>>>(x, y, g);
  CUDA_CHECK_LAUNCH();
}

void window_avgpool_backward(const float* dy, float* dx, const PoolGeom& g, cudaStream_t stream) {
  const int64_t ins = g.planes * g.h * g.w;
  if (ins <= 0) return;
  window_avgpool_backward_kernel<<<blocks_for(ins), kThreads, 0, stream>>>(dy, dx, g);
  CUDA_CHECK_LAUNCH();
}

void avgpool_forward(const float* x, float* y, int64_t planes, int64_t hw, cudaStream_t stream) {
  if (planes <= 0) return;
  avgpool_forward_kernel<<<grid_for(size_t(planes) * 32), kThreads, 0, stream>>>(x, y, planes, hw);
  CUDA_CHECK_LAUNCH();
}

void avgpool_backward(const float* dy, float* dx, int64_t planes, int64_t hw, cudaStream_t stream) {
  if (planes * hw <= 0) return;
  avgpool_backward_kernel<<<blocks_for(planes * hw), kThreads, 0, stream>>>(dy, dx, planes, hw);
  CUDA_CHECK_LAUNCH();
}

void gate_forward(const float* x, const float* g, float* y, int64_t planes, int64_t hw, cudaStream_t stream) {
  if (planes * hw <= 0) return;
  gate_forward_kernel<<<blocks_for(planes * hw), kThreads, 0, stream>>>(x, g, y, planes, hw);
  CUDA_CHECK_LAUNCH();
}

void gate_backward(const float* x, const float* g, const float* dy, float* dx, float* dg, int64_t planes,
                   int64_t hw, cudaStream_t stream) {
  if (planes * hw <= 0) return;
  gate_backward_kernel<<<grid_for(size_t(planes) * 32), kThreads, 0, stream>>>(x, g, dy, dx, dg, planes, hw);
  CUDA_CHECK_LAUNCH();
}

void pad_shortcut_forward(const float* x, float* y, const ShortcutGeom& g, cudaStream_t stream) {
  const int64_t n = g.n * g.out_c * g.out_h * g.out_w;
  if (n <= 0) return;
  pad_shortcut_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, g);
  CUDA_CHECK_LAUNCH();
}

void pad_shortcut_backward(const float* dy, float* dx, const ShortcutGeom& g, cudaStream_t stream) {
  const int64_t n = g.n * g.c * g.h * g.w;
  if (n <= 0) return;
  pad_shortcut_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dy, dx, g);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void channel_conv_forward(const T* x, const float* w, T* y, const ChannelConvGeom& g, cudaStream_t stream) {
  const int64_t n = g.rows * g.c;
  if (n <= 0) return;
  channel_mix_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(x, w, y, g, 1);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void channel_conv_backward(const T* x, const float* w, const T* dy, T* dx, float* dw, const ChannelConvGeom& g,
                           cudaStream_t stream) {
  const int64_t n = g.rows * g.c;
  if (n <= 0) return;
  channel_conv_dw_kernel<T><<<uint32_t(g.kernel), kTapThreads, 0, stream>>>(x, dy, dw, g);
  CUDA_CHECK_LAUNCH();
  if (!dx) return;
  channel_mix_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(dy, w, dx, g, -1);
  CUDA_CHECK_LAUNCH();
}

#define RT_CHANNEL_CONV_INSTANTIATE(T)                                                                    \
  template void channel_conv_forward(const T*, const float*, T*, const ChannelConvGeom&, cudaStream_t); \
  template void channel_conv_backward(const T*, const float*, const T*, T*, float*, const ChannelConvGeom&, \
                                      cudaStream_t);
RT_CHANNEL_CONV_INSTANTIATE(float)
RT_CHANNEL_CONV_INSTANTIATE(__nv_bfloat16)
RT_CHANNEL_CONV_INSTANTIATE(__half)
#undef RT_CHANNEL_CONV_INSTANTIATE

}  // namespace rt::cuda
