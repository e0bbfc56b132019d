// The 16-bit backends' kernels, templates over the storage type T (bf16 or f16): one thread per
// output element with grid-stride loops and 64-bit indices, fp32 arithmetic, one rounding to T
// per stored value (to_f32 / from_f32 of elementwise.cuh). Per-channel sums are in
// lowp_channel_sums.cu, batch norm in lowp_bn.cu.
#include "cuda/check.h"
#include "cuda/lowp_device.cuh"
#include "cuda/lowp_kernels.h"

namespace rt::cuda {
namespace {

using namespace lowp;

// ---- conversions ----

template <class T>
__global__ void nchw_to_nhwc_kernel(const float* src, T* dst, Dims4 d) {
  const int64_t n = d.numel();
  for (int64_t q = first_index(); q < n; q += grid_stride()) {
    const int64_t c = q % d.c, w = (q / d.c) % d.w, h = (q / (d.c * d.w)) % d.h,
                  b = q / (d.c * d.w * d.h);
    dst[q] = rn<T>(src[nchw_index(b, c, h, w, d.c, d.h, d.w)]);
  }
}

template <class T>
__global__ void nhwc_to_nchw_kernel(const T* src, float* dst, Dims4 d) {
  const int64_t n = d.numel();
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    const int64_t w = e % d.w, h = (e / d.w) % d.h, c = (e / (d.w * d.h)) % d.c,
                  b = e / (d.w * d.h * d.c);
    dst[e] = ld(src, nhwc_index(b, c, h, w, d.c, d.h, d.w));
  }
}

template <class T>
__global__ void f32_to_lowp_kernel(const float* src, T* dst, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = rn<T>(src[i]);
}

template <class T>
__global__ void lowp_to_f32_kernel(const T* src, float* dst, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = ld(src, i);
}

template <class T>
__global__ void weight_to_ohwi_kernel(const float* oihw, T* ohwi, WeightGeom g) {
  const int64_t n = g.count();
  for (int64_t e = first_index(); e < n; e += grid_stride())
    ohwi[ohwi_from_oihw(e, g)] = rn<T>(oihw[e]);
}

template <class S>
__global__ void weight_grad_kernel(const S* ohwi, float* oihw, WeightGeom g) {
  const int64_t n = g.count();
  for (int64_t e = first_index(); e < n; e += grid_stride())
    oihw[e] = to_f32(ohwi[ohwi_from_oihw(e, g)]);
}

// ---- element-wise ----

template <class T>
__global__ void relu_forward_kernel(const T* x, T* y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = rn<T>(relu_value(ld(x, i)));
}

template <class T>
__global__ void relu_backward_kernel(const T* y, const T* dy, T* dx, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dx[i] = relu_masked(y[i], dy[i]);
}

template <class T>
__global__ void add_forward_kernel(const T* a, const T* b, T* y, int64_t n, bool relu) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float s = ld(a, i) + ld(b, i);
    y[i] = rn<T>(relu ? relu_value(s) : s);
  }
}

// The same three on 16-byte vectors, where n is a multiple of kVec and every buffer is aligned.
template <class T>
__global__ void relu_forward_vec_kernel(const T* x, T* y, int64_t vectors) {
  for (int64_t v = first_index(); v < vectors; v += grid_stride()) {
    float e[kVec];
    load_vec(x, v, e);
#pragma unroll
    for (int k = 0; k < kVec; ++k) e[k] = relu_value(e[k]);
    store_vec(y, v, e);
  }
}

// dx = dy's own bits where y > 0 (no rounding), as the scalar kernel.
template <class T>
__global__ void relu_backward_vec_kernel(const T* y, const T* dy, T* dx, int64_t vectors) {
  for (int64_t v = first_index(); v < vectors; v += grid_stride())
    reinterpret_cast<uint4*>(dx)[v] = relu_masked<T>(load_raw(y, v), load_raw(dy, v));
}

template <class T>
__global__ void add_forward_vec_kernel(const T* a, const T* b, T* y, int64_t vectors, bool relu) {
  for (int64_t v = first_index(); v < vectors; v += grid_stride()) {
    float ea[kVec], eb[kVec];
    load_vec(a, v, ea);
    load_vec(b, v, eb);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float s = ea[k] + eb[k];
      ea[k] = relu ? relu_value(s) : s;
    }
    store_vec(y, v, ea);
  }
}

// Whether n two-byte elements at these pointers go as vectors.
bool vec_ok(int64_t n, std::initializer_list<const void*> ps) { return whole_vectors(size_t(n), 2, ps); }

template <class T>
__global__ void bias_add_kernel(T* y, const float* b, int64_t n, int64_t channels) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    y[i] = rn<T>(ld(y, i) + b[i % channels]);
}

template <class T>
__global__ void f32_bias_kernel(const float* y32, const float* b, T* y, int64_t n,
                                int64_t channels) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    y[i] = rn<T>(y32[i] + (b ? b[i % channels] : 0.0f));
}

// ---- pooling and shortcut (NHWC) ----

// f(ih, iw) for the input positions inside the window of output (oh, ow), rows then columns
// (padding positions skipped): the window order that decides ties.
template <class F>
__device__ inline void for_window(int64_t oh, int64_t ow, const NhwcPoolGeom& g, F&& f) {
  for (int64_t i = 0; i < g.kernel; ++i) {
    const int64_t ih = oh * g.stride - g.pad + i;
    if (ih < 0 || ih >= g.h) continue;
    for (int64_t j = 0; j < g.kernel; ++j) {
      const int64_t iw = ow * g.stride - g.pad + j;
      if (iw >= 0 && iw < g.w) f(ih, iw);
    }
  }
}

template <class T>
__global__ void maxpool_forward_kernel(const T* x, T* y, int32_t* argmax, NhwcPoolGeom g) {
  const int64_t outs = g.n * g.out_h * g.out_w * g.c;
  for (int64_t q = first_index(); q < outs; q += grid_stride()) {
    const int64_t c = q % g.c, ow = (q / g.c) % g.out_w, oh = (q / (g.c * g.out_w)) % g.out_h,
                  b = q / (g.c * g.out_w * g.out_h);
    const T* xp = x + b * g.h * g.w * g.c + c;
    float best = -INFINITY;
    int64_t best_i = -1;
    for_window(oh, ow, g, [&](int64_t ih, int64_t iw) {
      const float v = ld(xp, (ih * g.w + iw) * g.c);
      if (best_i < 0 || v > best || isnan(v)) {
        best = v;
        best_i = ih * g.w + iw;
      }
    });
    y[q] = rn<T>(best);
    if (argmax) argmax[q] = int32_t(best_i);
  }
}

// Outputs whose window covers input row i: o * stride - pad <= i < o * stride - pad + kernel.
__device__ inline void window_range(int64_t i, int64_t kernel, int64_t stride, int64_t pad,
                                    int64_t out, int64_t* lo, int64_t* hi) {
  const int64_t t = i + pad - kernel + 1;
  *lo = t <= 0 ? 0 : (t + stride - 1) / stride;
  const int64_t h = (i + pad) / stride + 1;
  *hi = h < out ? h : out;
}

template <class T>
__global__ void maxpool_backward_kernel(const int32_t* argmax, const T* dy, T* dx,
                                        NhwcPoolGeom g) {
  const int64_t ins = g.n * g.h * g.w * g.c;
  for (int64_t e = first_index(); e < ins; e += grid_stride()) {
    const int64_t c = e % g.c, iw = (e / g.c) % g.w, ih = (e / (g.c * g.w)) % g.h,
                  b = e / (g.c * g.w * g.h);
    const int32_t self = int32_t(ih * g.w + iw);
    int64_t oh0, oh1, ow0, ow1;
    window_range(ih, g.kernel, g.stride, g.pad, g.out_h, &oh0, &oh1);
    window_range(iw, g.kernel, g.stride, g.pad, g.out_w, &ow0, &ow1);
    float s = 0.0f;
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t q = nhwc_index(b, c, oh, ow, g.c, g.out_h, g.out_w);
        if (argmax[q] == self) s += ld(dy, q);
      }
    dx[e] = rn<T>(s);
  }
}

// The same two on groups of kVec channels (c a multiple of kVec, buffers aligned): a thread per
// (output or input position, channel group), 16-byte loads and stores, the window arithmetic
// once for all eight channels, and per channel the same rules and summation order as above.
template <class T>
__global__ void maxpool_forward_vec_kernel(const T* x, T* y, int32_t* argmax, NhwcPoolGeom g) {
  const int64_t groups = g.c / kVec, outs = g.n * g.out_h * g.out_w * groups;
  for (int64_t q = first_index(); q < outs; q += grid_stride()) {
    const int64_t grp = q % groups, pos = q / groups;  // pos = (b * out_h + oh) * out_w + ow
    const int64_t ow = pos % g.out_w, oh = (pos / g.out_w) % g.out_h, b = pos / (g.out_w * g.out_h);
    float best[kVec];
    int32_t best_i[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      best[k] = -INFINITY;
      best_i[k] = -1;
    }
    for_window(oh, ow, g, [&](int64_t ih, int64_t iw) {
      float v[kVec];
      load_vec(x, ((b * g.h + ih) * g.w + iw) * groups + grp, v);
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        if (best_i[k] < 0 || v[k] > best[k] || isnan(v[k])) {
          best[k] = v[k];
          best_i[k] = int32_t(ih * g.w + iw);
        }
    });
    store_vec(y, q, best);
    if (argmax) {
      int4* a = reinterpret_cast<int4*>(argmax + q * kVec);
      a[0] = make_int4(best_i[0], best_i[1], best_i[2], best_i[3]);
      a[1] = make_int4(best_i[4], best_i[5], best_i[6], best_i[7]);
    }
  }
}

template <class T>
__global__ void maxpool_backward_vec_kernel(const int32_t* argmax, const T* dy, T* dx,
                                            NhwcPoolGeom g) {
  const int64_t groups = g.c / kVec, ins = g.n * g.h * g.w * groups;
  for (int64_t e = first_index(); e < ins; e += grid_stride()) {
    const int64_t grp = e % groups, pos = e / groups;  // pos = (b * h + ih) * w + iw
    const int64_t iw = pos % g.w, ih = (pos / g.w) % g.h, b = pos / (g.w * g.h);
    const int32_t self = int32_t(ih * g.w + iw);
    int64_t oh0, oh1, ow0, ow1;
    window_range(ih, g.kernel, g.stride, g.pad, g.out_h, &oh0, &oh1);
    window_range(iw, g.kernel, g.stride, g.pad, g.out_w, &ow0, &ow1);
    float s[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) s[k] = 0.0f;
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t q = ((b * g.out_h + oh) * g.out_w + ow) * groups + grp;
        const int4* a = reinterpret_cast<const int4*>(argmax + q * kVec);
        const int4 a0 = a[0], a1 = a[1];
        const int32_t am[kVec] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        float d[kVec];
        load_vec(dy, q, d);
#pragma unroll
        for (int k = 0; k < kVec; ++k)
          if (am[k] == self) s[k] += d[k];
      }
    store_vec(dx, e, s);
  }
}

// Window o's span [lo, hi) of a dimension of length len, clipped to the input: what average
// pooling counts.
__device__ inline void clipped_window(int64_t o, int64_t kernel, int64_t stride, int64_t pad,
                                      int64_t len, int64_t* lo, int64_t* hi) {
  const int64_t start = o * stride - pad, end = start + kernel;
  *lo = start < 0 ? 0 : start;
  *hi = end < len ? end : len;
}

// The count of window (oh, ow)'s input elements and its clipped rows and columns.
struct AvgWindow {
  int64_t h0, h1, w0, w1;
  __device__ AvgWindow(int64_t oh, int64_t ow, const NhwcPoolGeom& g) {
    clipped_window(oh, g.kernel, g.stride, g.pad, g.h, &h0, &h1);
    clipped_window(ow, g.kernel, g.stride, g.pad, g.w, &w0, &w1);
  }
  __device__ double count() const { return double((h1 - h0) * (w1 - w0)); }
};

// A backward term, rounded to fp32 before it is added, as the reference scatters it.
__device__ inline float avg_term(float dy, double count) { return float(double(dy) / count); }

template <class T>
__global__ void window_avgpool_forward_kernel(const T* x, T* y, NhwcPoolGeom g) {
  const int64_t outs = g.n * g.out_h * g.out_w * g.c;
  for (int64_t q = first_index(); q < outs; q += grid_stride()) {
    const int64_t c = q % g.c, ow = (q / g.c) % g.out_w, oh = (q / (g.c * g.out_w)) % g.out_h,
                  b = q / (g.c * g.out_w * g.out_h);
    const T* xp = x + b * g.h * g.w * g.c + c;
    const AvgWindow win(oh, ow, g);
    double s = 0;
    for (int64_t ih = win.h0; ih < win.h1; ++ih)
      for (int64_t iw = win.w0; iw < win.w1; ++iw) s += ld(xp, (ih * g.w + iw) * g.c);
    y[q] = rn<T>(float(s / win.count()));
  }
}

template <class T>
__global__ void window_avgpool_backward_kernel(const T* dy, T* dx, NhwcPoolGeom g) {
  const int64_t ins = g.n * g.h * g.w * g.c;
  for (int64_t e = first_index(); e < ins; e += grid_stride()) {
    const int64_t c = e % g.c, iw = (e / g.c) % g.w, ih = (e / (g.c * g.w)) % g.h,
                  b = e / (g.c * g.w * g.h);
    int64_t oh0, oh1, ow0, ow1;
    window_range(ih, g.kernel, g.stride, g.pad, g.out_h, &oh0, &oh1);
    window_range(iw, g.kernel, g.stride, g.pad, g.out_w, &ow0, &ow1);
    float s = 0.0f;
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t q = nhwc_index(b, c, oh, ow, g.c, g.out_h, g.out_w);
        s += avg_term(ld(dy, q), AvgWindow(oh, ow, g).count());
      }
    dx[e] = rn<T>(s);
  }
}

// The same two on groups of kVec channels (c a multiple of kVec, buffers aligned), as the max
// pool's: the window arithmetic once for eight channels, 16-byte loads and stores, per channel
// the same sums in the same order.
template <class T>
__global__ void window_avgpool_forward_vec_kernel(const T* x, T* y, NhwcPoolGeom g) {
  const int64_t groups = g.c / kVec, outs = g.n * g.out_h * g.out_w * groups;
  for (int64_t q = first_index(); q < outs; q += grid_stride()) {
    const int64_t grp = q % groups, pos = q / groups;  // pos = (b * out_h + oh) * out_w + ow
    const int64_t ow = pos % g.out_w, oh = (pos / g.out_w) % g.out_h, b = pos / (g.out_w * g.out_h);
    const AvgWindow win(oh, ow, g);
    double s[kVec] = {};
    for (int64_t ih = win.h0; ih < win.h1; ++ih)
      for (int64_t iw = win.w0; iw < win.w1; ++iw) {
        float v[kVec];
        load_vec(x, ((b * g.h + ih) * g.w + iw) * groups + grp, v);
#pragma unroll
        for (int k = 0; k < kVec; ++k) s[k] += v[k];
      }
    float m[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) m[k] = float(s[k] / win.count());
    store_vec(y, q, m);
  }
}

template <class T>
__global__ void window_avgpool_backward_vec_kernel(const T* dy, T* dx, NhwcPoolGeom g) {
  const int64_t groups = g.c / kVec, ins = g.n * g.h * g.w * groups;
  for (int64_t e = first_index(); e < ins; e += grid_stride()) {
    const int64_t grp = e % groups, pos = e / groups;  // pos = (b * h + ih) * w + iw
    const int64_t iw = pos % g.w, ih = (pos / g.w) % g.h, b = pos / (g.w * g.h);
    int64_t oh0, oh1, ow0, ow1;
    window_range(ih, g.kernel, g.stride, g.pad, g.out_h, &oh0, &oh1);
    window_range(iw, g.kernel, g.stride, g.pad, g.out_w, &ow0, &ow1);
    float s[kVec] = {};
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const double count = AvgWindow(oh, ow, g).count();
        float d[kVec];
        load_vec(dy, ((b * g.out_h + oh) * g.out_w + ow) * groups + grp, d);
#pragma unroll
        for (int k = 0; k < kVec; ++k) s[k] += avg_term(d[k], count);
      }
    store_vec(dx, e, s);
  }
}

template <class T>
__global__ void avgpool_forward_kernel(const T* x, T* y, int64_t n, int64_t c, int64_t hw) {
  const int64_t planes = n * c;
  for (int64_t p = first_index(); p < planes; p += grid_stride()) {
    const int64_t b = p / c, ch = p % c;
    float s = 0.0f;
    for (int64_t e = 0; e < hw; ++e) s += ld(x, (b * hw + e) * c + ch);
    y[p] = rn<T>(s / float(hw));
  }
}

template <class T>
__global__ void avgpool_backward_kernel(const T* dy, T* dx, int64_t n, int64_t c,
                                        int64_t hw) {
  const int64_t total = n * hw * c;
  for (int64_t i = first_index(); i < total; i += grid_stride())
    dx[i] = rn<T>(ld(dy, (i / (hw * c)) * c + i % c) / float(hw));
}

template <class T>
__global__ void pad_shortcut_forward_kernel(const T* x, T* y, ShortcutGeom g) {
  const int64_t n = g.n * g.out_h * g.out_w * g.out_c;
  for (int64_t q = first_index(); q < n; q += grid_stride()) {
    const int64_t oc = q % g.out_c, ow = (q / g.out_c) % g.out_w,
                  oh = (q / (g.out_c * g.out_w)) % g.out_h, b = q / (g.out_c * g.out_w * g.out_h);
    const int64_t c = oc - g.before;
    y[q] = (c < 0 || c >= g.c) ? rn<T>(0.0f)
                               : x[nhwc_index(b, c, oh * g.stride, ow * g.stride, g.c, g.h, g.w)];
  }
}

template <class T>
__global__ void pad_shortcut_backward_kernel(const T* dy, T* dx, ShortcutGeom g) {
  const int64_t n = g.n * g.h * g.w * g.c;
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    const int64_t c = e % g.c, iw = (e / g.c) % g.w, ih = (e / (g.c * g.w)) % g.h,
                  b = e / (g.c * g.w * g.h);
    const bool kept = ih % g.stride == 0 && iw % g.stride == 0;
    dx[e] = kept ? dy[nhwc_index(b, c + g.before, ih / g.stride, iw / g.stride, g.out_c, g.out_h,
                                 g.out_w)]
                 : rn<T>(0.0f);
  }
}

}  // namespace

template <class T>
void nchw_f32_to_nhwc_lowp(const float* src, T* dst, const Dims4& d, cudaStream_t stream) {
  if (d.numel() <= 0) return;
  nchw_to_nhwc_kernel<T><<<blocks_for(d.numel()), kThreads, 0, stream>>>(src, dst, d);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void nhwc_lowp_to_nchw_f32(const T* src, float* dst, const Dims4& d, cudaStream_t stream) {
  if (d.numel() <= 0) return;
  nhwc_to_nchw_kernel<T><<<blocks_for(d.numel()), kThreads, 0, stream>>>(src, dst, d);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void f32_to_lowp(const float* src, T* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  f32_to_lowp_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(src, dst, n);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void lowp_to_f32(const T* src, float* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  lowp_to_f32_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(src, dst, n);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void weight_to_ohwi_lowp(const float* oihw, T* ohwi, const WeightGeom& g, cudaStream_t stream) {
  if (g.count() <= 0) return;
  weight_to_ohwi_kernel<T><<<blocks_for(g.count()), kThreads, 0, stream>>>(oihw, ohwi, g);
  CUDA_CHECK_LAUNCH();
}

template <class S>
void weight_grad_to_oihw(const S* ohwi, float* oihw, const WeightGeom& g, cudaStream_t stream) {
  if (g.count() <= 0) return;
  weight_grad_kernel<S><<<blocks_for(g.count()), kThreads, 0, stream>>>(ohwi, oihw, g);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void lowp_relu_forward(const T* x, T* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (vec_ok(n, {x, y}))
    relu_forward_vec_kernel<T><<<blocks_for(n / kVec), kThreads, 0, stream>>>(x, y, n / kVec);
  else
    relu_forward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void lowp_relu_backward(const T* y, const T* dy, T* dx, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (vec_ok(n, {y, dy, dx}))
    relu_backward_vec_kernel<T><<<blocks_for(n / kVec), kThreads, 0, stream>>>(y, dy, dx, n / kVec);
  else
    relu_backward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(y, dy, dx, n);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void lowp_add_forward(const T* a, const T* b, T* y, int64_t n, bool relu, cudaStream_t stream) {
  if (n <= 0) return;
  if (vec_ok(n, {a, b, y}))
    add_forward_vec_kernel<T><<<blocks_for(n / kVec), kThreads, 0, stream>>>(a, b, y, n / kVec,
                                                                             relu);
  else
    add_forward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(a, b, y, n, relu);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void lowp_bias_add(T* y, const float* b, int64_t rows, int64_t channels, cudaStream_t stream) {
  if (rows * channels <= 0) return;
  bias_add_kernel<T><<<blocks_for(rows * channels), kThreads, 0, stream>>>(y, b, rows * channels,
                                                                          channels);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void f32_bias_to_lowp(const float* y32, const float* b, T* y, int64_t rows, int64_t channels,
                      cudaStream_t stream) {
  if (rows * channels <= 0) return;
  const int64_t n = rows * channels;
  f32_bias_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(y32, b, y, n, channels);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void lowp_maxpool_forward(const T* x, T* y, int32_t* argmax, const NhwcPoolGeom& g,
                          cudaStream_t stream) {
  const int64_t outs = g.n * g.out_h * g.out_w * g.c;
  if (outs <= 0) return;
  if (g.c % kVec == 0 && vec_ok(outs, {x, y, argmax}))
    maxpool_forward_vec_kernel<T><<<blocks_for(outs / kVec), kThreads, 0, stream>>>(x, y, argmax, g);
  else
    maxpool_forward_kernel<T><<<blocks_for(outs), kThreads, 0, stream>>>(x, y, argmax, g);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void lowp_maxpool_backward(const int32_t* argmax, const T* dy, T* dx, const NhwcPoolGeom& g,
                           cudaStream_t stream) {
  const int64_t ins = g.n * g.h * g.w * g.c;
  if (ins <= 0) return;
  if (g.c % kVec == 0 && vec_ok(ins, {argmax, dy, dx}))
    maxpool_backward_vec_kernel<T><<<blocks_for(ins / kVec), kThreads, 0, stream>>>(argmax, dy, dx, g);
  else
    maxpool_backward_kernel<T><<<blocks_for(ins), kThreads, 0, stream>>>(argmax, dy, dx, g);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void lowp_window_avgpool_forward(const T* x, T* y, const NhwcPoolGeom& g, cudaStream_t stream) {
  const int64_t outs = g.n * g.out_h * g.out_w * g.c;
  if (outs <= 0) return;
  if (g.c % kVec == 0 && vec_ok(outs, {x, y}))
    window_avgpool_forward_vec_kernel<T><<<blocks_for(outs / kVec), kThreads, 0, stream>>>(x, y, g);
  else
    window_avgpool_forward_kernel<T><<<blocks_for(outs), kThreads, 0, stream>>>(x, y, g);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void lowp_window_avgpool_backward(const T* dy, T* dx, const NhwcPoolGeom& g, cudaStream_t stream) {
  const int64_t ins = g.n * g.h * g.w * g.c;
  if (ins <= 0) return;
  if (g.c % kVec == 0 && vec_ok(ins, {dy, dx}))
    window_avgpool_backward_vec_kernel<T><<<blocks_for(ins / kVec), kThreads, 0, stream>>>(dy, dx, g);
  else
    window_avgpool_backward_kernel<T><<<blocks_for(ins), kThreads, 0, stream>>>(dy, dx, g);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void lowp_avgpool_forward(const T* x, T* y, int64_t n, int64_t c, int64_t hw,
                          cudaStream_t stream) {
  if (n * c <= 0 || hw <= 0) return;
  avgpool_forward_kernel<T><<<blocks_for(n * c), kThreads, 0, stream>>>(x, y, n, c, hw);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void lowp_avgpool_backward(const T* dy, T* dx, int64_t n, int64_t c, int64_t hw,
                           cudaStream_t stream) {
  if (n * c * hw <= 0) return;
  avgpool_backward_kernel<T><<<blocks_for(n * c * hw), kThreads, 0, stream>>>(dy, dx, n, c, hw);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void lowp_pad_shortcut_forward(const T* x, T* y, const ShortcutGeom& g, cudaStream_t stream) {
  const int64_t n = g.n * g.out_c * g.out_h * g.out_w;
  if (n <= 0) return;
  pad_shortcut_forward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(x, y, g);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void lowp_pad_shortcut_backward(const T* dy, T* dx, const ShortcutGeom& g, cudaStream_t stream) {
  const int64_t n = g.n * g.c * g.h * g.w;
  if (n <= 0) return;
  pad_shortcut_backward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(dy, dx, g);
  CUDA_CHECK_LAUNCH();
}

// The two storage types' launchers (and fp32 for the weight gradient of the linear layer).
#define RT_LOWP_INSTANTIATE(T)                                                                   \
  template void nchw_f32_to_nhwc_lowp(const float*, T*, const Dims4&, cudaStream_t);              \
  template void nhwc_lowp_to_nchw_f32(const T*, float*, const Dims4&, cudaStream_t);              \
  template void f32_to_lowp(const float*, T*, int64_t, cudaStream_t);                             \
  template void lowp_to_f32(const T*, float*, int64_t, cudaStream_t);                             \
  template void weight_to_ohwi_lowp(const float*, T*, const WeightGeom&, cudaStream_t);           \
  template void weight_grad_to_oihw(const T*, float*, const WeightGeom&, cudaStream_t);           \
  template void lowp_relu_forward(const T*, T*, int64_t, cudaStream_t);                           \
  template void lowp_relu_backward(const T*, const T*, T*, int64_t, cudaStream_t);                \
  template void lowp_add_forward(const T*, const T*, T*, int64_t, bool, cudaStream_t);            \
  template void lowp_bias_add(T*, const float*, int64_t, int64_t, cudaStream_t);                  \
  template void f32_bias_to_lowp(const float*, const float*, T*, int64_t, int64_t, cudaStream_t); \
  template void lowp_maxpool_forward(const T*, T*, int32_t*, const NhwcPoolGeom&, cudaStream_t);  \
  template void lowp_maxpool_backward(const int32_t*, const T*, T*, const NhwcPoolGeom&,          \
                                      cudaStream_t);                                              \
  template void lowp_window_avgpool_forward(const T*, T*, const NhwcPoolGeom&, cudaStream_t);     \
  template void lowp_window_avgpool_backward(const T*, T*, const NhwcPoolGeom&, cudaStream_t);    \
  template void lowp_avgpool_forward(const T*, T*, int64_t, int64_t, int64_t, cudaStream_t);      \
  template void lowp_avgpool_backward(const T*, T*, int64_t, int64_t, int64_t, cudaStream_t);     \
  template void lowp_pad_shortcut_forward(const T*, T*, const ShortcutGeom&, cudaStream_t);       \
  template void lowp_pad_shortcut_backward(const T*, T*, const ShortcutGeom&, cudaStream_t);
RT_LOWP_INSTANTIATE(bf16)
RT_LOWP_INSTANTIATE(f16)
#undef RT_LOWP_INSTANTIATE
template void weight_grad_to_oihw(const float*, float*, const WeightGeom&, cudaStream_t);

}  // namespace rt::cuda
