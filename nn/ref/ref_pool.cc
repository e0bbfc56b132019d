// Reference max pooling (padding acts as -inf, first maximum wins), windowed and global average
// pooling.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "nn/ref/ref_ops.h"

namespace rt::ref {
namespace {

template <class T>
class RefMaxPool final : public MaxPoolOp<T> {
 public:
  explicit RefMaxPool(const MaxPoolDesc& d) : d_(d), out_(d.out()), argmax_(size_t(out_.numel())) {}

  void forward(const T* x, T* y, bool train) override {
    pool(x, y);
    have_argmax_ = true;
  }

  void backward(const T* x, const T* y, const T* dy, T* dx) override {
    if (!have_argmax_) pool(x, nullptr);
    const int64_t in_plane = d_.in.h * d_.in.w, out_plane = out_.h * out_.w;
    const int64_t planes = d_.in.n * d_.in.c;
#pragma omp parallel for schedule(static) if (d_.in.numel() > kParallelWork)
    for (int64_t pl = 0; pl < planes; ++pl) {
      T* dxp = dx + pl * in_plane;
      for (int64_t e = 0; e < in_plane; ++e) dxp[e] = T(0);
      for (int64_t o = 0; o < out_plane; ++o) {
        const int64_t q = pl * out_plane + o;
        dxp[argmax_[size_t(q)]] += dy[q];
      }
    }
  }

 private:
  // Records, per output, the in-plane index of the window's maximum; writes y unless null.
  // Scans rows then columns and replaces only on a strictly larger value (or NaN, which
  // propagates as in PyTorch), so ties go to the first maximum in window order.
  void pool(const T* x, T* y) {
    const auto& d = d_;
    const int64_t H = d.in.h, W = d.in.w, OH = out_.h, OW = out_.w;
    const int64_t planes = d.in.n * d.in.c;
    int64_t* argmax = argmax_.data();
#pragma omp parallel for schedule(static) if (d_.in.numel() > kParallelWork)
    for (int64_t pl = 0; pl < planes; ++pl) {
      const T* xp = x + pl * H * W;
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          T best = -std::numeric_limits<T>::infinity();
          int64_t best_i = -1;
          for (int64_t i = 0; i < d.kernel; ++i) {
            const int64_t ih = oh * d.stride - d.pad + i;
            if (ih < 0 || ih >= H) continue;
            for (int64_t j = 0; j < d.kernel; ++j) {
              const int64_t iw = ow * d.stride - d.pad + j;
              if (iw < 0 || iw >= W) continue;
              const T v = xp[ih * W + iw];
              if (best_i < 0 || v > best || std::isnan(v)) {
                best = v;
                best_i = ih * W + iw;
              }
            }
          }
          // pad < kernel (validated) puts at least one real element in every window.
          const int64_t q = (pl * OH + oh) * OW + ow;
          argmax[q] = best_i;
          if (y) y[q] = best;
        }
    }
  }

  MaxPoolDesc d_;
  Shape out_;
  std::vector<int64_t> argmax_;
  bool have_argmax_ = false;
};

// Each output is the mean of the input elements its window covers (padding not counted), summed
// in double in window order; backward scatters dy / count to them, in output order.
template <class T>
class RefAvgPool final : public AvgPoolOp<T> {
 public:
  explicit RefAvgPool(const AvgPoolDesc& d) : d_(d), out_(d.out()) {}

  void forward(const T* x, T* y) override {
    each_window([&](int64_t q, int64_t h0, int64_t h1, int64_t w0, int64_t w1, int64_t pl) {
      const T* xp = x + pl * d_.in.h * d_.in.w;
      double s = 0;
      for (int64_t ih = h0; ih < h1; ++ih)
        for (int64_t iw = w0; iw < w1; ++iw) s += double(xp[ih * d_.in.w + iw]);
      y[q] = T(s / double((h1 - h0) * (w1 - w0)));
    });
  }

  void backward(const T* dy, T* dx) override {
    const int64_t in_plane = d_.in.h * d_.in.w;
    for (int64_t e = 0; e < d_.in.numel(); ++e) dx[e] = T(0);
    each_window([&](int64_t q, int64_t h0, int64_t h1, int64_t w0, int64_t w1, int64_t pl) {
      T* dxp = dx + pl * in_plane;
      const T g = T(double(dy[q]) / double((h1 - h0) * (w1 - w0)));
      for (int64_t ih = h0; ih < h1; ++ih)
        for (int64_t iw = w0; iw < w1; ++iw) dxp[ih * d_.in.w + iw] += g;
    });
  }

 private:
  // f(output index, the window's rows [h0, h1) and columns [w0, w1) clipped to the
  // input, plane) for every output, planes in parallel.
  template <class F>
  void each_window(F f) {
    const auto& d = d_;
    const int64_t planes = d.in.n * d.in.c, OH = out_.h, OW = out_.w;
#pragma omp parallel for schedule(static) if (d_.in.numel() > kParallelWork)
    for (int64_t pl = 0; pl < planes; ++pl)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const int64_t h = oh * d.stride - d.pad, w = ow * d.stride - d.pad;
          f((pl * OH + oh) * OW + ow, std::max<int64_t>(h, 0),
            std::min(h + d.kernel, d.in.h), std::max<int64_t>(w, 0), std::min(w + d.kernel, d.in.w), pl);
        }
  }

  AvgPoolDesc d_;
  Shape out_;
};

template <class T>
class RefGlobalAvgPool final : public GlobalAvgPoolOp<T> {
 public:
  explicit RefGlobalAvgPool(const GlobalAvgPoolDesc& d) : d_(d) {}

  void forward(const T* x, T* y) override {
    const int64_t hw = d_.in.h * d_.in.w, planes = d_.in.n * d_.in.c;
    for (int64_t pl = 0; pl < planes; ++pl) {
      double s = 0;
      for (int64_t e = 0; e < hw; ++e) s += x[pl * hw + e];
      y[pl] = T(s / double(hw));
    }
  }

  void backward(const T* dy, T* dx) override {
    const int64_t hw = d_.in.h * d_.in.w, planes = d_.in.n * d_.in.c;
    for (int64_t pl = 0; pl < planes; ++pl) {
      const T g = T(double(dy[pl]) / double(hw));
      for (int64_t e = 0; e < hw; ++e) dx[pl * hw + e] = g;
    }
  }

 private:
  GlobalAvgPoolDesc d_;
};

}  // namespace

template <class T>
std::unique_ptr<MaxPoolOp<T>> make_maxpool(const MaxPoolDesc& d) {
  d.validate();
  return std::make_unique<RefMaxPool<T>>(d);
}

template <class T>
std::unique_ptr<AvgPoolOp<T>> make_avgpool(const AvgPoolDesc& d) {
  d.validate();
  return std::make_unique<RefAvgPool<T>>(d);
}

template <class T>
std::unique_ptr<GlobalAvgPoolOp<T>> make_global_avgpool(const GlobalAvgPoolDesc& d) {
  RT_SHAPE_CHECK(d.in.numel() > 0, "layer ", d.name, ": global average pool of an empty input ",
                 d.in.str());
  return std::make_unique<RefGlobalAvgPool<T>>(d);
}

template std::unique_ptr<MaxPoolOp<float>> make_maxpool<float>(const MaxPoolDesc&);
template std::unique_ptr<MaxPoolOp<double>> make_maxpool<double>(const MaxPoolDesc&);
template std::unique_ptr<AvgPoolOp<float>> make_avgpool<float>(const AvgPoolDesc&);
template std::unique_ptr<AvgPoolOp<double>> make_avgpool<double>(const AvgPoolDesc&);
template std::unique_ptr<GlobalAvgPoolOp<float>> make_global_avgpool<float>(const GlobalAvgPoolDesc&);
template std::unique_ptr<GlobalAvgPoolOp<double>> make_global_avgpool<double>(const GlobalAvgPoolDesc&);

}  // namespace rt::ref
