// Reference convolution (im2col + loop GEMM per group) and fully connected layer, NCHW, float or double.
#include <algorithm>
#include <vector>

#include "nn/ref/ref_ops.h"
#include "nn/tensor.h"

namespace rt::ref {
namespace {

// Dot product in double with eight interleaved partial sums: a fixed order (deterministic) whose
// independent additions overlap, unlike one serial double accumulator.
template <class T>
double dot(const T* a, const T* b, int64_t n) {
  double part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += double(a[i + j]) * double(b[i + j]);
  double s = 0;
  for (; i < n; ++i) s += double(a[i]) * double(b[i]);
  for (int j = 0; j < 8; ++j) s += part[j];
  return s;
}

// Parallel loops write disjoint outputs and keep a fixed summation order inside each, so results
// do not depend on the thread count.
template <class T>
class RefConv final : public ConvOp<T> {
 public:
  explicit RefConv(const ConvDesc& d)
      : d_(d),
        out_(d.out()),
        k_(d.in.c * d.kernel_h * d.kernel_w),
        kg_(d.in_per_group() * d.kernel_h * d.kernel_w),
        p_(out_.h * out_.w) {}

  void forward(const T* x, const T* w, const T* b, T* y) override {
    if (col_.size() == 0) col_.resize(size_t(k_ * p_));
    for (int64_t n = 0; n < d_.in.n; ++n) {
      im2col(x + n * d_.in.chw());
      T* yn = y + n * out_.chw();
      const T* col = col_.data();
      const int64_t K = kg_, P = p_;
#pragma omp parallel for schedule(static) if (d_.out_c * K * P > kParallelWork)
      for (int64_t o = 0; o < d_.out_c; ++o) {
        T* yo = yn + o * P;
        const T bias = (d_.bias && b) ? b[o] : T(0);
        for (int64_t p = 0; p < P; ++p) yo[p] = bias;
        const T* wo = w + o * K;
        const T* colg = col + group_of(o) * K * P;  // the rows of o's input channels
        for (int64_t k = 0; k < K; ++k) {
          const T wk = wo[k];
          const T* ck = colg + k * P;
          for (int64_t p = 0; p < P; ++p) yo[p] += wk * ck[p];
        }
      }
    }
  }

  void backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db) override {
    if (dcol_.size() == 0) {
      col_.resize(size_t(k_ * p_));
      dcol_.resize(size_t(k_ * p_));
    }
    dw_acc_.assign(size_t(d_.weight_count()), 0.0);
    db_acc_.assign(size_t(d_.out_c), 0.0);
    const int64_t K = kg_, P = p_;
    for (int64_t n = 0; n < d_.in.n; ++n) {
      im2col(x + n * d_.in.chw());
      const T* dyn = dy + n * out_.chw();
      const T* col = col_.data();
      double* dw_acc = dw_acc_.data();
      double* db_acc = db_acc_.data();
#pragma omp parallel for schedule(static) if (d_.out_c * K * P > kParallelWork)
      for (int64_t o = 0; o < d_.out_c; ++o) {
        const T* dyo = dyn + o * P;
        double s = 0;
        for (int64_t p = 0; p < P; ++p) s += dyo[p];
        db_acc[o] += s;
        const T* colg = col + group_of(o) * K * P;
        for (int64_t k = 0; k < K; ++k) dw_acc[o * K + k] += dot(dyo, colg + k * P, P);
      }
      if (dx) {
        T* dcol = dcol_.data();
        // Row k of dcol is of group g = k / kg_: only g's outputs read it.
        const int64_t opg = d_.out_c / d_.groups;
#pragma omp parallel for schedule(static) if (d_.out_c * K * P > kParallelWork)
        for (int64_t k = 0; k < k_; ++k) {
          T* dk = dcol + k * P;
          const int64_t g = k / K, kk = k % K;
          for (int64_t p = 0; p < P; ++p) dk[p] = T(0);
          for (int64_t o = g * opg; o < (g + 1) * opg; ++o) {
            const T wk = w[o * K + kk];
            const T* dyo = dyn + o * P;
            for (int64_t p = 0; p < P; ++p) dk[p] += wk * dyo[p];
          }
        }
        col2im(dx + n * d_.in.chw());
      }
    }
    for (int64_t i = 0; i < d_.weight_count(); ++i) dw[i] = T(dw_acc_[size_t(i)]);
    if (d_.bias && db)
      for (int64_t o = 0; o < d_.out_c; ++o) db[o] = T(db_acc_[size_t(o)]);
  }

 private:
  // col_[k][p] = x[c][oh*sh - ph + i][ow*sw - pw + j] (0 outside), k = (c*kh + i)*kw + j.
  void im2col(const T* x) {
    T* col = col_.data();
    const auto& d = d_;
    const int64_t OH = out_.h, OW = out_.w, P = p_;
#pragma omp parallel for schedule(static) if (k_ * P > kParallelWork)
    for (int64_t c = 0; c < d.in.c; ++c) {
      const T* xc = x + c * d.in.h * d.in.w;
      for (int64_t i = 0; i < d.kernel_h; ++i)
        for (int64_t j = 0; j < d.kernel_w; ++j) {
          T* ck = col + ((c * d.kernel_h + i) * d.kernel_w + j) * P;
          for (int64_t oh = 0; oh < OH; ++oh) {
            const int64_t ih = oh * d.stride_h - d.pad_h + i;
            for (int64_t ow = 0; ow < OW; ++ow) {
              const int64_t iw = ow * d.stride_w - d.pad_w + j;
              const bool inside = ih >= 0 && ih < d.in.h && iw >= 0 && iw < d.in.w;
              ck[oh * OW + ow] = inside ? xc[ih * d.in.w + iw] : T(0);
            }
          }
        }
    }
  }

  // The adjoint of im2col: dx[c][ih][iw] = sum of dcol_ entries that read it. One channel per
  // thread, so no two threads touch the same element.
  void col2im(T* dx) {
    const T* dcol = dcol_.data();
    const auto& d = d_;
    const int64_t OH = out_.h, OW = out_.w, P = p_;
#pragma omp parallel for schedule(static) if (k_ * P > kParallelWork)
    for (int64_t c = 0; c < d.in.c; ++c) {
      T* dxc = dx + c * d.in.h * d.in.w;
      for (int64_t e = 0; e < d.in.h * d.in.w; ++e) dxc[e] = T(0);
      for (int64_t i = 0; i < d.kernel_h; ++i)
        for (int64_t j = 0; j < d.kernel_w; ++j) {
          const T* dk = dcol + ((c * d.kernel_h + i) * d.kernel_w + j) * P;
          for (int64_t oh = 0; oh < OH; ++oh) {
            const int64_t ih = oh * d.stride_h - d.pad_h + i;
            if (ih < 0 || ih >= d.in.h) continue;
            for (int64_t ow = 0; ow < OW; ++ow) {
              const int64_t iw = ow * d.stride_w - d.pad_w + j;
              if (iw >= 0 && iw < d.in.w) dxc[ih * d.in.w + iw] += dk[oh * OW + ow];
            }
          }
        }
    }
  }

  // The group of output channel o; its input channels are im2col rows [g kg_, (g + 1) kg_).
  int64_t group_of(int64_t o) const { return o / (d_.out_c / d_.groups); }

  ConvDesc d_;
  Shape out_;
  // GEMM sizes: im2col rows C*KH*KW, of them one group's (its reduction), output pixels OH*OW
  int64_t k_, kg_, p_;
  // Sized at first use: a network built for its layout alone, or run forward only, holds none
  // of the backward's (dw_acc_ alone is the size of the weights).
  Buffer<T> col_, dcol_;
  std::vector<double> dw_acc_, db_acc_;  // weight gradients summed over the batch in double
};

template <class T>
class RefLinear final : public LinearOp<T> {
 public:
  explicit RefLinear(const LinearDesc& d) : d_(d), in_(d.in.chw()), out_(d.out_features) {}

  void forward(const T* x, const T* w, const T* b, T* y) override {
    const int64_t I = in_, O = out_;
    for (int64_t n = 0; n < d_.in.n; ++n) {
      const T* xn = x + n * I;
#pragma omp parallel for schedule(static) if (O * I > kParallelWork)
      for (int64_t o = 0; o < O; ++o) {
        const T* wo = w + o * I;
        y[n * O + o] = T(((d_.bias && b) ? double(b[o]) : 0.0) + dot(xn, wo, I));
      }
    }
  }

  void backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db) override {
    const int64_t I = in_, O = out_, N = d_.in.n;
    if (dx) {
      for (int64_t n = 0; n < N; ++n) {
        const T* dyn = dy + n * O;
#pragma omp parallel for schedule(static) if (O * I > kParallelWork)
        for (int64_t i = 0; i < I; ++i) {
          double acc = 0;
          for (int64_t o = 0; o < O; ++o) acc += double(dyn[o]) * double(w[o * I + i]);
          dx[n * I + i] = T(acc);
        }
      }
    }
#pragma omp parallel for schedule(static) if (N * O * I > kParallelWork)
    for (int64_t o = 0; o < O; ++o) {
      for (int64_t i = 0; i < I; ++i) {
        double acc = 0;
        for (int64_t n = 0; n < N; ++n) acc += double(dy[n * O + o]) * double(x[n * I + i]);
        dw[o * I + i] = T(acc);
      }
      if (d_.bias && db) {
        double acc = 0;
        for (int64_t n = 0; n < N; ++n) acc += dy[n * O + o];
        db[o] = T(acc);
      }
    }
  }

 private:
  LinearDesc d_;
  int64_t in_, out_;
};

}  // namespace

template <class T>
std::unique_ptr<ConvOp<T>> make_conv(const ConvDesc& d) {
  d.validate();
  return std::make_unique<RefConv<T>>(d);
}

template <class T>
std::unique_ptr<LinearOp<T>> make_linear(const LinearDesc& d) {
  d.validate();
  return std::make_unique<RefLinear<T>>(d);
}

template std::unique_ptr<ConvOp<float>> make_conv<float>(const ConvDesc&);
template std::unique_ptr<ConvOp<double>> make_conv<double>(const ConvDesc&);
template std::unique_ptr<LinearOp<float>> make_linear<float>(const LinearDesc&);
template std::unique_ptr<LinearOp<double>> make_linear<double>(const LinearDesc&);

}  // namespace rt::ref
