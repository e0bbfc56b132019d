// Batch normalisation over the backend layouts with the ReLU fused, in one OpenMP region per
// call: a single pass for the statistics (sums shifted by one sample per channel, so no
// cancellation), one pass to normalise; backward recomputes the ReLU mask from x rather than
// reading y. Fewer passes over memory and far fewer barriers than oneDNN 2.6's AVX2 kernel,
// which on two cores shared with other work lost whole scheduler slices at each barrier.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "nn/onednn/onednn_common.h"

// The vector helpers below are always inlined, so GCC's warning that returning a 32-byte vector
// differs with and without AVX concerns no real call.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace rt::dnn {
namespace {

// Rows are runs of hw pixels of L interleaved channels: (n, 8-channel block) rows of L = 8 in
// nChw8c, (n, c) rows of L = 1 in plain NCHW.

#define RT_CLONES __attribute__((target_clones("avx2", "default")))

template <int L>
inline __attribute__((always_inline)) void stats_row(const float* x, int64_t hw, const float* shift,
                                                     float* s1, float* s2) {
  float a1[L] = {}, a2[L] = {}, b1[L] = {}, b2[L] = {};
  int64_t p = 0;
  for (; p + 1 < hw; p += 2)
    for (int k = 0; k < L; ++k) {
      const float d = x[p * L + k] - shift[k], e = x[(p + 1) * L + k] - shift[k];
      a1[k] += d;
      a2[k] += d * d;
      b1[k] += e;
      b2[k] += e * e;
    }
  for (; p < hw; ++p)
    for (int k = 0; k < L; ++k) {
      const float d = x[p * L + k] - shift[k];
      a1[k] += d;
      a2[k] += d * d;
    }
  for (int k = 0; k < L; ++k) s1[k] = a1[k] + b1[k], s2[k] = a2[k] + b2[k];
}

// y = x * a + b, then ReLU. The backward pass recomputes x * a + b with the same expression to
// find the ReLU mask.
template <int L>
inline __attribute__((always_inline)) void normalise_row(const float* x, float* y, int64_t hw,
                                                         const float* a, const float* b, bool relu) {
  if (relu) {
    for (int64_t p = 0; p < hw; ++p)
      for (int k = 0; k < L; ++k) {
        const float v = x[p * L + k] * a[k] + b[k];
        y[p * L + k] = v > 0.f ? v : 0.f;
      }
  } else {
    for (int64_t p = 0; p < hw; ++p)
      for (int k = 0; k < L; ++k) y[p * L + k] = x[p * L + k] * a[k] + b[k];
  }
}

// s1 = sum g, s2 = sum g (x - mean), g = dy masked by the ReLU.
template <int L>
inline __attribute__((always_inline)) void grad_sums_row(const float* x, const float* dy, int64_t hw,
                                                         const float* a, const float* b,
                                                         const float* mean, bool relu, float* s1,
                                                         float* s2) {
  float a1[L] = {}, a2[L] = {};
  for (int64_t p = 0; p < hw; ++p)
    for (int k = 0; k < L; ++k) {
      const float xv = x[p * L + k], d = dy[p * L + k];
      const float g = (!relu || xv * a[k] + b[k] > 0.f) ? d : 0.f;
      a1[k] += g;
      a2[k] += g * (xv - mean[k]);
    }
  for (int k = 0; k < L; ++k) s1[k] = a1[k], s2[k] = a2[k];
}

// dx = A g + B (x - mean) + C.
template <int L>
inline __attribute__((always_inline)) void grad_apply_row(const float* x, const float* dy, float* dx,
                                                          int64_t hw, const float* a, const float* b,
                                                          const float* mean, const float* ca,
                                                          const float* cb, const float* cc, bool relu) {
  for (int64_t p = 0; p < hw; ++p)
    for (int k = 0; k < L; ++k) {
      const float xv = x[p * L + k], d = dy[p * L + k];
      const float g = (!relu || xv * a[k] + b[k] > 0.f) ? d : 0.f;
      dx[p * L + k] = ca[k] * g + cb[k] * (xv - mean[k]) + cc[k];
    }
}

// The nChw8c rows with GCC vector extensions: one 8-float vector per pixel (two SSE registers
// in the baseline build, one AVX register in the AVX2 clone).
typedef float V8 __attribute__((vector_size(32)));
typedef int I8 __attribute__((vector_size(32)));
inline __attribute__((always_inline)) V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline __attribute__((always_inline)) void store8(float* p, const V8& v) { std::memcpy(p, &v, sizeof v); }
// m ? v : 0 for a comparison mask m.
inline __attribute__((always_inline)) V8 keep(const I8& m, const V8& v) { return (V8)(m & (I8)v); }

RT_CLONES void stats_row8(const float* x, int64_t hw, const float* shift, float* s1, float* s2) {
  const V8 sh = load8(shift);
  V8 a1 = {}, a2 = {}, b1 = {}, b2 = {};
  int64_t p = 0;
  for (; p + 1 < hw; p += 2) {
    const V8 d = load8(x + p * 8) - sh, e = load8(x + p * 8 + 8) - sh;
    a1 += d;
    a2 += d * d;
    b1 += e;
    b2 += e * e;
  }
  if (p < hw) {
    const V8 d = load8(x + p * 8) - sh;
    a1 += d;
    a2 += d * d;
  }
  store8(s1, a1 + b1);
  store8(s2, a2 + b2);
}

RT_CLONES void normalise_row8(const float* x, float* y, int64_t hw, const float* a, const float* b, bool relu) {
  const V8 va = load8(a), vb = load8(b), zero = {};
  if (relu)
    for (int64_t p = 0; p < hw; ++p) {
      const V8 v = load8(x + p * 8) * va + vb;
      store8(y + p * 8, keep(v > zero, v));
    }
  else
    for (int64_t p = 0; p < hw; ++p) store8(y + p * 8, load8(x + p * 8) * va + vb);
}

RT_CLONES void grad_sums_row8(const float* x, const float* dy, int64_t hw, const float* a, const float* b,
                              const float* mean, bool relu, float* s1, float* s2) {
  const V8 va = load8(a), vb = load8(b), vm = load8(mean), zero = {};
  V8 a1 = {}, a2 = {};
  if (relu)
    for (int64_t p = 0; p < hw; ++p) {
      const V8 xv = load8(x + p * 8), g = keep(xv * va + vb > zero, load8(dy + p * 8));
      a1 += g;
      a2 += g * (xv - vm);
    }
  else
    for (int64_t p = 0; p < hw; ++p) {
      const V8 xv = load8(x + p * 8), g = load8(dy + p * 8);
      a1 += g;
      a2 += g * (xv - vm);
    }
  store8(s1, a1);
  store8(s2, a2);
}

RT_CLONES void grad_apply_row8(const float* x, const float* dy, float* dx, int64_t hw, const float* a,
                               const float* b, const float* mean, const float* ca, const float* cb,
                               const float* cc, bool relu) {
  const V8 va = load8(a), vb = load8(b), vm = load8(mean), zero = {};
  const V8 A = load8(ca), B = load8(cb), C = load8(cc);
  if (relu)
    for (int64_t p = 0; p < hw; ++p) {
      const V8 xv = load8(x + p * 8), g = keep(xv * va + vb > zero, load8(dy + p * 8));
      store8(dx + p * 8, A * g + B * (xv - vm) + C);
    }
  else
    for (int64_t p = 0; p < hw; ++p) {
      const V8 xv = load8(x + p * 8), g = load8(dy + p * 8);
      store8(dx + p * 8, A * g + B * (xv - vm) + C);
    }
}

class LoopBatchNorm final : public BatchNormOp<float> {
 public:
  explicit LoopBatchNorm(const BatchNormDesc& d)
      : name_(d.name), in_(d.in), relu_(d.relu), eps_(d.eps), momentum_(d.momentum),
        lanes_(act_blocked(d.in) ? 8 : 1), c_(d.in.c), hw_(d.in.h * d.in.w),
        rows_(d.in.n * d.in.c / lanes_), count_(d.in.n * d.in.h * d.in.w),
        max_threads_(std::max(omp_get_max_threads(), omp_get_num_procs())) {
    for (Buffer<float>* b : {&shift_, &mean_, &var_, &invstd_, &a_, &b_, &ca_, &cb_, &cc_})
      b->resize(size_t(c_));
    partial_.resize(size_t(max_threads_) * 2 * size_t(c_));
  }

  void forward_train(const float* x, const float* gamma, const float* beta, float* y,
                     float* running_mean, float* running_var) override {
    // As PyTorch: the unbiased variance of a single value is undefined.
    RT_SHAPE_CHECK(count_ > 1, "layer ", name_, ": batch norm training needs more than one value per ",
                   "channel, got input ", in_.str());
    // Shift each channel by its first sample: sums of (x - shift) stay small where the mean is
    // large next to the spread, so the one-pass variance keeps its precision.
    for (int64_t c = 0; c < c_; ++c) shift_[size_t(c)] = x[row_of(c) * hw_ * lanes_ + c % lanes_];
    const double m = double(count_);
#pragma omp parallel num_threads(threads())
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      double* p1 = partial_.data() + size_t(t) * 2 * size_t(c_);
      double* p2 = p1 + c_;
      std::fill(p1, p1 + 2 * c_, 0.0);
      const auto [r0, r1] = split(t, nt);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t c0 = chan0(r);
        float s1[8] = {}, s2[8] = {};
        if (lanes_ == 8)
          stats_row8(x + r * hw_ * 8, hw_, shift_.data() + c0, s1, s2);
        else
          stats_row<1>(x + r * hw_, hw_, shift_.data() + c0, s1, s2);
        for (int k = 0; k < lanes_; ++k) p1[c0 + k] += s1[k], p2[c0 + k] += s2[k];
      }
#pragma omp barrier
#pragma omp for schedule(static)
      for (int64_t c = 0; c < c_; ++c) {
        double d1 = 0, d2 = 0;
        for (int i = 0; i < nt; ++i) {
          d1 += partial_[size_t(i) * 2 * size_t(c_) + size_t(c)];
          d2 += partial_[(size_t(i) * 2 + 1) * size_t(c_) + size_t(c)];
        }
        const double dm = d1 / m, var = std::max(d2 / m - dm * dm, 0.0);
        const double mean = double(shift_[size_t(c)]) + dm, invstd = 1.0 / std::sqrt(var + eps_);
        mean_[size_t(c)] = float(mean);
        var_[size_t(c)] = float(var);
        invstd_[size_t(c)] = float(invstd);
        a_[size_t(c)] = float(double(gamma[c]) * invstd);
        b_[size_t(c)] = float(double(beta[c]) - mean * double(gamma[c]) * invstd);
      }
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t c0 = chan0(r), off = r * hw_ * lanes_;
        if (lanes_ == 8)
          normalise_row8(x + off, y + off, hw_, a_.data() + c0, b_.data() + c0, relu_);
        else
          normalise_row<1>(x + off, y + off, hw_, a_.data() + c0, b_.data() + c0, relu_);
      }
    }
    const double mom = momentum_, unbias = m / (m - 1.0);
    for (int64_t c = 0; c < c_; ++c) {
      running_mean[c] = float((1 - mom) * double(running_mean[c]) + mom * double(mean_[size_t(c)]));
      running_var[c] = float((1 - mom) * double(running_var[c]) + mom * double(var_[size_t(c)]) * unbias);
    }
  }

  void forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                    const float* running_var, float* y) override {
    // Own coefficient arrays: an evaluation between forward_train and backward must not disturb
    // the training ones.
    for (int64_t c = 0; c < c_; ++c) {
      const double invstd = 1.0 / std::sqrt(double(running_var[c]) + eps_);
      ca_[size_t(c)] = float(double(gamma[c]) * invstd);
      cb_[size_t(c)] = float(double(beta[c]) - double(running_mean[c]) * double(gamma[c]) * invstd);
    }
#pragma omp parallel for schedule(static) num_threads(threads())
    for (int64_t r = 0; r < rows_; ++r) {
      const int64_t c0 = chan0(r), off = r * hw_ * lanes_;
      if (lanes_ == 8)
        normalise_row8(x + off, y + off, hw_, ca_.data() + c0, cb_.data() + c0, relu_);
      else
        normalise_row<1>(x + off, y + off, hw_, ca_.data() + c0, cb_.data() + c0, relu_);
    }
  }

  // The ReLU mask is recomputed from x with forward_train's coefficients, so y is not read.
  void backward(const float* x, const float* gamma, const float* y, const float* dy, float* dx,
                float* dgamma, float* dbeta) override {
    const double m = double(count_);
#pragma omp parallel num_threads(threads())
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      double* p1 = partial_.data() + size_t(t) * 2 * size_t(c_);
      double* p2 = p1 + c_;
      std::fill(p1, p1 + 2 * c_, 0.0);
      const auto [r0, r1] = split(t, nt);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t c0 = chan0(r), off = r * hw_ * lanes_;
        float s1[8] = {}, s2[8] = {};
        if (lanes_ == 8)
          grad_sums_row8(x + off, dy + off, hw_, a_.data() + c0, b_.data() + c0, mean_.data() + c0, relu_,
                         s1, s2);
        else
          grad_sums_row<1>(x + off, dy + off, hw_, a_.data() + c0, b_.data() + c0, mean_.data() + c0,
                           relu_, s1, s2);
        for (int k = 0; k < lanes_; ++k) p1[c0 + k] += s1[k], p2[c0 + k] += s2[k];
      }
#pragma omp barrier
#pragma omp for schedule(static)
      for (int64_t c = 0; c < c_; ++c) {
        double sg = 0, sgx = 0;
        for (int i = 0; i < nt; ++i) {
          sg += partial_[size_t(i) * 2 * size_t(c_) + size_t(c)];
          sgx += partial_[(size_t(i) * 2 + 1) * size_t(c_) + size_t(c)];
        }
        // dx = gamma invstd / M (M g - sum g - xhat sum g xhat), xhat = (x - mean) invstd.
        const double invstd = invstd_[size_t(c)], A = double(gamma[c]) * invstd;
        dbeta[c] = float(sg);
        dgamma[c] = float(sgx * invstd);
        ca_[size_t(c)] = float(A);
        cb_[size_t(c)] = float(-A * invstd * invstd * sgx / m);
        cc_[size_t(c)] = float(-A * sg / m);
      }
      if (dx)
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t c0 = chan0(r), off = r * hw_ * lanes_;
          if (lanes_ == 8)
            grad_apply_row8(x + off, dy + off, dx + off, hw_, a_.data() + c0, b_.data() + c0,
                            mean_.data() + c0, ca_.data() + c0, cb_.data() + c0, cc_.data() + c0, relu_);
          else
            grad_apply_row<1>(x + off, dy + off, dx + off, hw_, a_.data() + c0, b_.data() + c0,
                              mean_.data() + c0, ca_.data() + c0, cb_.data() + c0, cc_.data() + c0, relu_);
        }
    }
  }

 private:
  int threads() const { return std::min(omp_get_max_threads(), max_threads_); }
  // Contiguous share of the rows for thread t of nt.
  std::pair<int64_t, int64_t> split(int t, int nt) const {
    return {rows_ * t / nt, rows_ * (t + 1) / nt};
  }
  int64_t chan0(int64_t r) const { return (r % (c_ / lanes_)) * lanes_; }
  int64_t row_of(int64_t c) const { return c / lanes_; }  // the row of channel c in sample 0

  std::string name_;
  Shape in_;
  bool relu_;
  double eps_, momentum_;
  int64_t lanes_, c_, hw_, rows_, count_;
  int max_threads_;
  // Per channel: shift, batch statistics, forward coefficients (a, b), backward ones (ca, cb, cc;
  // also the evaluation coefficients).
  Buffer<float> shift_, mean_, var_, invstd_, a_, b_, ca_, cb_, cc_;
  Buffer<double> partial_;  // per thread, two sums per channel
};

}  // namespace

std::unique_ptr<BatchNormOp<float>> make_batchnorm_op(const ContextPtr&, const BatchNormDesc& d) {
  return std::make_unique<LoopBatchNorm>(d);
}

}  // namespace rt::dnn
