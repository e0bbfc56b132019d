// Batch normalisation over the backend layouts with the ReLU fused, in one OpenMP region per
// call: one pass over memory for the statistics (two-pass accuracy: each row is revisited in
// cache), one pass to normalise; backward recomputes the ReLU mask from x rather than
// reading y. Fewer passes over memory and far fewer barriers than oneDNN 2.6's AVX2 kernel,
// which on two cores shared with other work lost whole scheduler slices at each barrier.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "nn/onednn/clones.h"
#include "nn/onednn/onednn_common.h"

// The vector helpers below are always inlined, so GCC's warning that returning a 32- or 64-byte
// vector differs with and without AVX concerns no real call.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace rt::dnn {
namespace {

// Rows are runs of hw pixels of L interleaved channels: (n, channel block) rows of L = 8 or 16 in
// nChw8c or nChw16c, (n, c) rows of L = 1 in plain NCHW.

// Mean and sum of squared deviations of one row, per lane: two passes over the row, the second
// from cache (a row is at most a few hundred KB), so the variance has two-pass accuracy for
// one pass of memory traffic. m2 is corrected for the rounding of the mean.
template <int L>
inline __attribute__((always_inline)) void stats_row(const float* x, int64_t hw, float* mean, float* m2) {
  float s[L] = {};
  for (int64_t p = 0; p < hw; ++p)
    for (int k = 0; k < L; ++k) s[k] += x[p * L + k];
  for (int k = 0; k < L; ++k) mean[k] = s[k] / float(hw);
  float d1[L] = {}, d2[L] = {};
  for (int64_t p = 0; p < hw; ++p)
    for (int k = 0; k < L; ++k) {
      const float d = x[p * L + k] - mean[k];
      d1[k] += d;
      d2[k] += d * d;
    }
  for (int k = 0; k < L; ++k) m2[k] = d2[k] - d1[k] * d1[k] / float(hw);
}

// Every pass evaluates the normalised value as v = (x - m) * a + b per channel (training:
// m the batch mean, a = gamma invstd, b = beta; evaluation: the running statistics). Subtracting
// the mean first keeps the rounding relative to v, and backward recomputes the ReLU mask v > 0
// with the very same expression.
template <int L>
inline __attribute__((always_inline)) void normalise_row(const float* x, float* y, int64_t hw,
                                                         const float* m, const float* a,
                                                         const float* b, bool relu) {
  for (int64_t p = 0; p < hw; ++p)
    for (int k = 0; k < L; ++k) {
      const float v = (x[p * L + k] - m[k]) * a[k] + b[k];
      y[p * L + k] = (!relu || !(v <= 0.f)) ? v : 0.f;  // NaN passes, as in the reference
    }
}

// s1 = sum g, s2 = sum g (x - m), g = dy masked by the ReLU.
template <int L>
inline __attribute__((always_inline)) void grad_sums_row(const float* x, const float* dy, int64_t hw,
                                                         const float* m, const float* a,
                                                         const float* b, bool relu, float* s1,
                                                         float* s2) {
  float a1[L] = {}, a2[L] = {};
  for (int64_t p = 0; p < hw; ++p)
    for (int k = 0; k < L; ++k) {
      const float xm = x[p * L + k] - m[k], d = dy[p * L + k];
      const float g = (!relu || xm * a[k] + b[k] > 0.f) ? d : 0.f;
      a1[k] += g;
      a2[k] += g * xm;
    }
  for (int k = 0; k < L; ++k) s1[k] = a1[k], s2[k] = a2[k];
}

// dx = A g + B (x - m) + C.
template <int L>
inline __attribute__((always_inline)) void grad_apply_row(const float* x, const float* dy, float* dx,
                                                          int64_t hw, const float* m, const float* a,
                                                          const float* b, const float* ca,
                                                          const float* cb, const float* cc, bool relu) {
  for (int64_t p = 0; p < hw; ++p)
    for (int k = 0; k < L; ++k) {
      const float xm = x[p * L + k] - m[k], d = dy[p * L + k];
      const float g = (!relu || xm * a[k] + b[k] > 0.f) ? d : 0.f;
      dx[p * L + k] = ca[k] * g + cb[k] * xm + cc[k];
    }
}

// The blocked rows with GCC vector extensions: one vector of L = 8 or 16 floats per pixel (in the
// AVX2 clone one or two AVX registers, in the baseline build two or four SSE ones). The bodies
// are templates on the vector type, inlined into one cloned function per block size.
typedef float V8 __attribute__((vector_size(32)));
typedef int I8 __attribute__((vector_size(32)));
typedef float V16 __attribute__((vector_size(64)));
typedef int I16 __attribute__((vector_size(64)));
template <class V>
inline __attribute__((always_inline)) V loadv(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V>
inline __attribute__((always_inline)) void storev(float* p, const V& v) { std::memcpy(p, &v, sizeof v); }
// m ? v : 0 for a comparison mask m.
template <class V, class I>
inline __attribute__((always_inline)) V keep(const I& m, const V& v) { return (V)(m & (I)v); }

template <class V>
inline __attribute__((always_inline)) void stats_rowv(const float* x, int64_t hw, float* mean, float* m2) {
  constexpr int L = sizeof(V) / sizeof(float);
  V s0 = {}, s1 = {};
  int64_t p = 0;
  for (; p + 1 < hw; p += 2) {
    s0 += loadv<V>(x + p * L);
    s1 += loadv<V>(x + p * L + L);
  }
  if (p < hw) s0 += loadv<V>(x + p * L);
  const V vm = (s0 + s1) / float(hw);
  V d1 = {}, d2 = {};
  for (p = 0; p < hw; ++p) {
    const V d = loadv<V>(x + p * L) - vm;
    d1 += d;
    d2 += d * d;
  }
  storev(mean, vm);
  storev(m2, d2 - d1 * d1 / float(hw));
}

template <class V, class I>
inline __attribute__((always_inline)) void normalise_rowv(const float* x, float* y, int64_t hw, const float* m,
                                                          const float* a, const float* b, bool relu) {
  constexpr int L = sizeof(V) / sizeof(float);
  const V vm = loadv<V>(m), va = loadv<V>(a), vb = loadv<V>(b), zero = {};
  if (relu)
    for (int64_t p = 0; p < hw; ++p) {
      const V v = (loadv<V>(x + p * L) - vm) * va + vb;
      storev(y + p * L, keep<V, I>(~(v <= zero), v));
    }
  else
    for (int64_t p = 0; p < hw; ++p) storev(y + p * L, (loadv<V>(x + p * L) - vm) * va + vb);
}

template <class V, class I>
inline __attribute__((always_inline)) void grad_sums_rowv(const float* x, const float* dy, int64_t hw,
                                                          const float* m, const float* a, const float* b,
                                                          bool relu, float* s1, float* s2) {
  constexpr int L = sizeof(V) / sizeof(float);
  const V vm = loadv<V>(m), va = loadv<V>(a), vb = loadv<V>(b), zero = {};
  V a1 = {}, a2 = {};
  if (relu)
    for (int64_t p = 0; p < hw; ++p) {
      const V xm = loadv<V>(x + p * L) - vm, g = keep<V, I>(xm * va + vb > zero, loadv<V>(dy + p * L));
      a1 += g;
      a2 += g * xm;
    }
  else
    for (int64_t p = 0; p < hw; ++p) {
      const V xm = loadv<V>(x + p * L) - vm, g = loadv<V>(dy + p * L);
      a1 += g;
      a2 += g * xm;
    }
  storev(s1, a1);
  storev(s2, a2);
}

template <class V, class I>
inline __attribute__((always_inline)) void grad_apply_rowv(const float* x, const float* dy, float* dx, int64_t hw,
                                                           const float* m, const float* a, const float* b,
                                                           const float* ca, const float* cb, const float* cc,
                                                           bool relu) {
  constexpr int L = sizeof(V) / sizeof(float);
  const V vm = loadv<V>(m), va = loadv<V>(a), vb = loadv<V>(b), zero = {};
  const V A = loadv<V>(ca), B = loadv<V>(cb), C = loadv<V>(cc);
  if (relu)
    for (int64_t p = 0; p < hw; ++p) {
      const V xm = loadv<V>(x + p * L) - vm, g = keep<V, I>(xm * va + vb > zero, loadv<V>(dy + p * L));
      storev(dx + p * L, A * g + B * xm + C);
    }
  else
    for (int64_t p = 0; p < hw; ++p) {
      const V xm = loadv<V>(x + p * L) - vm, g = loadv<V>(dy + p * L);
      storev(dx + p * L, A * g + B * xm + C);
    }
}

// One cloned entry point per pass and block size.
RT_CLONES void stats_row8(const float* x, int64_t hw, float* mean, float* m2) { stats_rowv<V8>(x, hw, mean, m2); }
RT_CLONES void stats_row16(const float* x, int64_t hw, float* mean, float* m2) { stats_rowv<V16>(x, hw, mean, m2); }
RT_CLONES void normalise_row8(const float* x, float* y, int64_t hw, const float* m, const float* a, const float* b,
                              bool relu) {
  normalise_rowv<V8, I8>(x, y, hw, m, a, b, relu);
}
RT_CLONES void normalise_row16(const float* x, float* y, int64_t hw, const float* m, const float* a, const float* b,
                               bool relu) {
  normalise_rowv<V16, I16>(x, y, hw, m, a, b, relu);
}
RT_CLONES void grad_sums_row8(const float* x, const float* dy, int64_t hw, const float* m, const float* a,
                              const float* b, bool relu, float* s1, float* s2) {
  grad_sums_rowv<V8, I8>(x, dy, hw, m, a, b, relu, s1, s2);
}
RT_CLONES void grad_sums_row16(const float* x, const float* dy, int64_t hw, const float* m, const float* a,
                               const float* b, bool relu, float* s1, float* s2) {
  grad_sums_rowv<V16, I16>(x, dy, hw, m, a, b, relu, s1, s2);
}
RT_CLONES void grad_apply_row8(const float* x, const float* dy, float* dx, int64_t hw, const float* m,
                               const float* a, const float* b, const float* ca, const float* cb, const float* cc,
                               bool relu) {
  grad_apply_rowv<V8, I8>(x, dy, dx, hw, m, a, b, ca, cb, cc, relu);
}
RT_CLONES void grad_apply_row16(const float* x, const float* dy, float* dx, int64_t hw, const float* m,
                                const float* a, const float* b, const float* ca, const float* cb, const float* cc,
                                bool relu) {
  grad_apply_rowv<V16, I16>(x, dy, dx, hw, m, a, b, ca, cb, cc, relu);
}

// A row of `lanes` interleaved channels (16, 8 or 1): the pass for its width.
void stats_row_any(int lanes, const float* x, int64_t hw, float* mean, float* m2) {
  if (lanes == 16) stats_row16(x, hw, mean, m2);
  else if (lanes == 8) stats_row8(x, hw, mean, m2);
  else stats_row<1>(x, hw, mean, m2);
}
void normalise_row_any(int lanes, const float* x, float* y, int64_t hw, const float* m, const float* a,
                       const float* b, bool relu) {
  if (lanes == 16) normalise_row16(x, y, hw, m, a, b, relu);
  else if (lanes == 8) normalise_row8(x, y, hw, m, a, b, relu);
  else normalise_row<1>(x, y, hw, m, a, b, relu);
}
void grad_sums_row_any(int lanes, const float* x, const float* dy, int64_t hw, const float* m, const float* a,
                       const float* b, bool relu, float* s1, float* s2) {
  if (lanes == 16) grad_sums_row16(x, dy, hw, m, a, b, relu, s1, s2);
  else if (lanes == 8) grad_sums_row8(x, dy, hw, m, a, b, relu, s1, s2);
  else grad_sums_row<1>(x, dy, hw, m, a, b, relu, s1, s2);
}
void grad_apply_row_any(int lanes, const float* x, const float* dy, float* dx, int64_t hw, const float* m,
                        const float* a, const float* b, const float* ca, const float* cb, const float* cc,
                        bool relu) {
  if (lanes == 16) grad_apply_row16(x, dy, dx, hw, m, a, b, ca, cb, cc, relu);
  else if (lanes == 8) grad_apply_row8(x, dy, dx, hw, m, a, b, ca, cb, cc, relu);
  else grad_apply_row<1>(x, dy, dx, hw, m, a, b, ca, cb, cc, relu);
}

// Synchronised (BatchNormDesc::sync), each call splits where the group's sums are needed: the
// per-channel sums of this rank's rows in one OpenMP region, their sum over the group outside
// any region (an MPI call, which may throw), the rest in a second region.
class LoopBatchNorm final : public BatchNormOp<float> {
 public:
  LoopBatchNorm(const BatchNormDesc& d, int block)
      : name_(d.name), in_(d.in), relu_(d.relu), eps_(d.eps), momentum_(d.momentum), sync_(d.sync),
        lanes_(act_blocked(d.in, block) ? block : 1), c_(d.in.c), hw_(d.in.h * d.in.w),
        rows_(d.in.n * d.in.c / lanes_), count_(d.in.n * d.in.h * d.in.w),
        max_threads_(std::max(omp_get_max_threads(), omp_get_num_procs())) {
    for (Buffer<float>* b : {&mean_, &var_, &invstd_, &a_, &b_, &ca_, &cb_, &cc_, &em_, &ea_, &eb_})
      b->resize(size_t(c_));
    partial_.resize(size_t(max_threads_) * 3 * size_t(c_));
    if (sync_) group_.resize(3 * size_t(c_) + 1);
  }

  void forward_train(const float* x, const float* gamma, const float* beta, float* y,
                     float* running_mean, float* running_var) override {
    double m = double(count_);
    if (!sync_) {
      check_count(m);
#pragma omp parallel num_threads(threads())
      {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        row_stats(x, t, nt);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t c = 0; c < c_; ++c) {
          const Sums s = thread_sums(c, nt, 3);
          set_coefficients(c, s.v[0], s.v[1], s.v[2], double(in_.n), gamma, beta);
        }
        normalise_rows(x, y, t, nt);
      }
    } else {
#pragma omp parallel num_threads(threads())
      {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        row_stats(x, t, nt);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t c = 0; c < c_; ++c) {
          const Sums s = thread_sums(c, nt, 3);
          for (int k = 0; k < 3; ++k) group_[size_t(k * c_ + c)] = s.v[k];
        }
      }
      group_[size_t(3 * c_)] = double(in_.n);
      sync_->sum(group_.data(), group_.size());
      const double rows = group_[size_t(3 * c_)];
      m = rows * double(hw_);
      check_count(m);
#pragma omp parallel num_threads(threads())
      {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
#pragma omp for schedule(static)
        for (int64_t c = 0; c < c_; ++c)
          set_coefficients(c, group_[size_t(c)], group_[size_t(c_ + c)], group_[size_t(2 * c_ + c)], rows,
                           gamma, beta);
        normalise_rows(x, y, t, nt);
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
      em_[size_t(c)] = running_mean[c];
      ea_[size_t(c)] = float(double(gamma[c]) / std::sqrt(double(running_var[c]) + eps_));
      eb_[size_t(c)] = beta[c];
    }
#pragma omp parallel for schedule(static) num_threads(threads())
    for (int64_t r = 0; r < rows_; ++r) {
      const int64_t c0 = chan0(r), off = r * hw_ * lanes_;
      normalise_row_any(int(lanes_), x + off, y + off, hw_, em_.data() + c0, ea_.data() + c0, eb_.data() + c0,
                        relu_);
    }
  }

  // The ReLU mask is recomputed from x with forward_train's coefficients, so y is not read (nor
  // kept for it). dgamma and dbeta are this rank's sums; synchronised, dx takes the group's.
  bool backward_reads_y() const override { return false; }
  void backward(const float* x, const float* gamma, const float* y, const float* dy, float* dx,
                float* dgamma, float* dbeta) override {
#pragma omp parallel num_threads(threads())
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      grad_sums(x, dy, t, nt);
#pragma omp barrier
#pragma omp for schedule(static)
      for (int64_t c = 0; c < c_; ++c) {
        const Sums s = own_grad_sums(c, nt, dgamma, dbeta);
        if (!sync_) {
          set_grad_coefficients(c, s.v[0], s.v[1], double(count_), gamma);
        } else {
          group_[size_t(c)] = s.v[0];
          group_[size_t(c_ + c)] = s.v[1];
        }
      }
      if (!sync_ && dx) grad_apply(x, dy, dx, t, nt);
    }
    if (!sync_ || !dx) return;
    sync_->sum(group_.data(), 2 * size_t(c_));
    const double m = group_m_;
#pragma omp parallel num_threads(threads())
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
#pragma omp for schedule(static)
      for (int64_t c = 0; c < c_; ++c) set_grad_coefficients(c, group_[size_t(c)], group_[size_t(c_ + c)], m, gamma);
      grad_apply(x, dy, dx, t, nt);
    }
  }

 private:
  struct Sums {
    double v[3];
  };
  int threads() const { return std::min(omp_get_max_threads(), max_threads_); }
  // Contiguous share of the rows for thread t of nt.
  std::pair<int64_t, int64_t> split(int t, int nt) const {
    return {rows_ * t / nt, rows_ * (t + 1) / nt};
  }
  int64_t chan0(int64_t r) const { return (r % (c_ / lanes_)) * lanes_; }
  double* partials(int t) { return partial_.data() + size_t(t) * 3 * size_t(c_); }

  // As PyTorch: the unbiased variance of a single value is undefined.
  void check_count(double m) {
    group_m_ = m;
    RT_SHAPE_CHECK(m > 1, "layer ", name_, ": batch norm training needs more than one value per ",
                   "channel, got input ", in_.str(), sync_ ? " over the group's ranks" : "");
  }

  // Thread t's rows into its partials: per channel, the sum of row means mu_r, of mu_r^2, and
  // of the rows' squared deviations M2_r (hw values each).
  void row_stats(const float* x, int t, int nt) {
    double* p1 = partials(t);
    double* p2 = p1 + c_;
    double* p3 = p2 + c_;
    std::fill(p1, p1 + 3 * c_, 0.0);
    const auto [r0, r1] = split(t, nt);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t c0 = chan0(r);
      float mu[16] = {}, m2[16] = {};
      stats_row_any(int(lanes_), x + r * hw_ * lanes_, hw_, mu, m2);
      for (int k = 0; k < lanes_; ++k) {
        p1[c0 + k] += mu[k];
        p2[c0 + k] += double(mu[k]) * double(mu[k]);
        p3[c0 + k] += m2[k];
      }
    }
  }

  // The first `n` of channel c's partial sums, added over the nt threads in thread order.
  Sums thread_sums(int64_t c, int nt, int n) {
    Sums s{};
    for (int i = 0; i < nt; ++i) {
      const double* q = partials(i) + c;
      for (int k = 0; k < n; ++k) s.v[k] += q[k * c_];
    }
    return s;
  }

  // Rows are combined as in Chan et al.: with `rows` row means mu_r and deviations M2_r (hw
  // values each), M2 = sum M2_r + hw (sum mu_r^2 - (sum mu_r)^2 / rows), in double.
  void set_coefficients(int64_t c, double s1, double s2, double s3, double rows, const float* gamma,
                        const float* beta) {
    const double mean = s1 / rows;
    const double var = std::max((s3 + double(hw_) * (s2 - s1 * mean)) / (rows * double(hw_)), 0.0);
    const double invstd = 1.0 / std::sqrt(var + eps_);
    mean_[size_t(c)] = float(mean);
    var_[size_t(c)] = float(var);
    invstd_[size_t(c)] = float(invstd);
    a_[size_t(c)] = float(double(gamma[c]) * invstd);
    b_[size_t(c)] = beta[c];
  }

  void normalise_rows(const float* x, float* y, int t, int nt) {
    const auto [r0, r1] = split(t, nt);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t c0 = chan0(r), off = r * hw_ * lanes_;
      normalise_row_any(int(lanes_), x + off, y + off, hw_, mean_.data() + c0, a_.data() + c0, b_.data() + c0,
                        relu_);
    }
  }

  // Thread t's rows into its partials: per channel, sum g and sum g (x - mean).
  void grad_sums(const float* x, const float* dy, int t, int nt) {
    double* p1 = partials(t);
    double* p2 = p1 + c_;
    std::fill(p1, p1 + 2 * c_, 0.0);
    const auto [r0, r1] = split(t, nt);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t c0 = chan0(r), off = r * hw_ * lanes_;
      float s1[16] = {}, s2[16] = {};
      grad_sums_row_any(int(lanes_), x + off, dy + off, hw_, mean_.data() + c0, a_.data() + c0, b_.data() + c0,
                        relu_, s1, s2);
      for (int k = 0; k < lanes_; ++k) p1[c0 + k] += s1[k], p2[c0 + k] += s2[k];
    }
  }

  // Channel c's sum g and sum g (x - mean) over this rank's rows, and from them its gamma and
  // beta gradients.
  Sums own_grad_sums(int64_t c, int nt, float* dgamma, float* dbeta) {
    const Sums s = thread_sums(c, nt, 2);
    dbeta[c] = float(s.v[0]);
    dgamma[c] = float(s.v[1] * invstd_[size_t(c)]);
    return s;
  }

  // dx = gamma invstd / M (M g - sum g - xhat sum g xhat), xhat = (x - mean) invstd, as
  // dx = A g + B (x - mean) + C; sg = sum g, sgx = sum g (x - mean) over m values.
  void set_grad_coefficients(int64_t c, double sg, double sgx, double m, const float* gamma) {
    const double invstd = invstd_[size_t(c)], A = double(gamma[c]) * invstd;
    ca_[size_t(c)] = float(A);
    cb_[size_t(c)] = float(-A * invstd * invstd * sgx / m);
    cc_[size_t(c)] = float(-A * sg / m);
  }

  void grad_apply(const float* x, const float* dy, float* dx, int t, int nt) {
    const auto [r0, r1] = split(t, nt);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t c0 = chan0(r), off = r * hw_ * lanes_;
      grad_apply_row_any(int(lanes_), x + off, dy + off, dx + off, hw_, mean_.data() + c0, a_.data() + c0,
                         b_.data() + c0, ca_.data() + c0, cb_.data() + c0, cc_.data() + c0, relu_);
    }
  }

  std::string name_;
  Shape in_;
  bool relu_;
  double eps_, momentum_;
  BnSync* sync_;
  int64_t lanes_, c_, hw_, rows_, count_;
  int max_threads_;
  double group_m_ = 0;  // values per channel the last forward_train's statistics cover
  // Per channel: batch statistics, training coefficients (mean, a, b), backward ones
  // (ca, cb, cc), evaluation ones (em, ea, eb).
  Buffer<float> mean_, var_, invstd_, a_, b_, ca_, cb_, cc_, em_, ea_, eb_;
  Buffer<double> partial_;  // per thread, three sums per channel
  Buffer<double> group_;    // synchronised: the sums the group adds (3 per channel and the rows)
};

}  // namespace

std::unique_ptr<BatchNormOp<float>> make_batchnorm_op(const ContextPtr& ctx, const BatchNormDesc& d) {
  return std::make_unique<LoopBatchNorm>(d, ctx->block);
}

}  // namespace rt::dnn
