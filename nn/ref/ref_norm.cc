// Reference batch normalisation (PyTorch semantics) with an optional fused ReLU and residual add.
#include <cmath>
#include <vector>

#include "nn/ref/ref_ops.h"

namespace rt::ref {
namespace {

template <class T>
class RefBatchNorm final : public BatchNormOp<T> {
 public:
  explicit RefBatchNorm(const BatchNormDesc& d)
      : d_(d), hw_(d.in.h * d.in.w), m_(d.in.n * d.in.h * d.in.w),
        mean_(size_t(d.in.c)), invstd_(size_t(d.in.c)), sums_(size_t(2 * d.in.c + 1)) {}

  void forward_train(const T* x, const T* gamma, const T* beta, T* y, T* running_mean,
                     T* running_var) override {
    train(x, nullptr, gamma, beta, y, running_mean, running_var);
  }
  void forward_train_add(const T* x, const T* r, const T* gamma, const T* beta, T* y, T* running_mean,
                         T* running_var) override {
    train(x, r, gamma, beta, y, running_mean, running_var);
  }
  void forward_eval(const T* x, const T* gamma, const T* beta, const T* running_mean,
                    const T* running_var, T* y) override {
    eval(x, nullptr, gamma, beta, running_mean, running_var, y);
  }
  void forward_eval_add(const T* x, const T* r, const T* gamma, const T* beta, const T* running_mean,
                        const T* running_var, T* y) override {
    eval(x, r, gamma, beta, running_mean, running_var, y);
  }

  // The add's mask in place (as its backward), then backward: the node's contract, which the
  // GPU backends' single pass must match.
  bool masks_add_relu() const override { return d_.residual && d_.relu; }
  void backward_add_relu(const T* x, const T* gamma, const T* y, T* dy, T* dx, T* dgamma,
                         T* dbeta) override {
    RT_SHAPE_CHECK(masks_add_relu(), "layer ", d_.name, ": backward_add_relu without a residual's ReLU");
    for (int64_t i = 0; i < d_.in.numel(); ++i)
      if (!(y[i] > T(0))) dy[i] = T(0);
    backward(x, gamma, nullptr, dy, dx, dgamma, dbeta);
  }

  // With g = dy (masked by y > 0 under the fused ReLU, unless that follows a residual add: then
  // the caller masked dy) and xhat the normalised input:
  // dbeta = sum g, dgamma = sum g xhat, dx = gamma invstd / M (M g - dbeta - xhat dgamma).
  // Synchronised, dx takes both sums over the group's batches (M too); dgamma and dbeta stay
  // this rank's, whose average over the ranks the gradient reducer takes.
  void backward(const T* x, const T* gamma, const T* y, const T* dy, T* dx, T* dgamma,
                T* dbeta) override {
    const bool relu = d_.relu && !d_.residual;
    auto grad = [&](int64_t i) { return (relu && !(y[i] > T(0))) ? 0.0 : double(dy[i]); };
    const int64_t C = d_.in.c;
#pragma omp parallel for schedule(static) if (d_.in.numel() > kParallelWork)
    for (int64_t c = 0; c < C; ++c) {
      const double mean = mean_[size_t(c)], invstd = invstd_[size_t(c)];
      double sg = 0, sgx = 0;
      for_channel(c, [&](int64_t i) {
        const double g = grad(i);
        sg += g;
        sgx += g * (x[i] - mean) * invstd;
      });
      dbeta[c] = T(sg);
      dgamma[c] = T(sgx);
      sums_[size_t(c)] = sg;
      sums_[size_t(C + c)] = sgx;
    }
    if (!dx) return;
    if (d_.sync) d_.sync->sum(sums_.data(), size_t(2 * C));
    const double M = count_;
#pragma omp parallel for schedule(static) if (d_.in.numel() > kParallelWork)
    for (int64_t c = 0; c < C; ++c) {
      const double mean = mean_[size_t(c)], invstd = invstd_[size_t(c)];
      const double sg = sums_[size_t(c)], sgx = sums_[size_t(C + c)];
      const double scale = double(gamma[c]) * invstd / M;
      for_channel(c, [&](int64_t i) {
        const double xhat = (x[i] - mean) * invstd;
        dx[i] = T(scale * (M * grad(i) - sg - xhat * sgx));
      });
    }
  }

 private:
  // Two passes over x: the mean, then the squared deviations from it (no cancellation for large
  // means); synchronised, each pass's sums are added over the group before they are used.
  void train(const T* x, const T* r, const T* gamma, const T* beta, T* y, T* running_mean,
             T* running_var) {
    const int64_t C = d_.in.c;
#pragma omp parallel for schedule(static) if (d_.in.numel() > kParallelWork)
    for (int64_t c = 0; c < C; ++c) {
      double sum = 0;
      for_channel(c, [&](int64_t i) { sum += x[i]; });
      sums_[size_t(c)] = sum;
    }
    sums_[size_t(C)] = double(m_);
    if (d_.sync) d_.sync->sum(sums_.data(), size_t(C + 1));
    count_ = sums_[size_t(C)];
    // PyTorch refuses this too: the unbiased variance of one value is undefined.
    RT_SHAPE_CHECK(count_ > 1, "layer ", d_.name, ": batch norm training needs more than one value per ",
                   "channel, got input ", d_.in.str(), d_.sync ? " over the group's ranks" : "");
#pragma omp parallel for schedule(static) if (d_.in.numel() > kParallelWork)
    for (int64_t c = 0; c < C; ++c) {
      const double mean = sums_[size_t(c)] / count_;
      double sq = 0;
      for_channel(c, [&](int64_t i) { sq += (x[i] - mean) * (x[i] - mean); });
      mean_[size_t(c)] = mean;
      sums_[size_t(C + 1 + c)] = sq;
    }
    if (d_.sync) d_.sync->sum(sums_.data() + C + 1, size_t(C));
    const double mom = d_.momentum;
#pragma omp parallel for schedule(static) if (d_.in.numel() > kParallelWork)
    for (int64_t c = 0; c < C; ++c) {
      const double mean = mean_[size_t(c)], sq = sums_[size_t(C + 1 + c)];
      invstd_[size_t(c)] = 1.0 / std::sqrt(sq / count_ + d_.eps);
      normalise(c, x, r, gamma, beta, mean, invstd_[size_t(c)], y);
      running_mean[c] = T((1 - mom) * double(running_mean[c]) + mom * mean);
      running_var[c] = T((1 - mom) * double(running_var[c]) + mom * sq / (count_ - 1));
    }
  }

  void eval(const T* x, const T* r, const T* gamma, const T* beta, const T* running_mean,
            const T* running_var, T* y) const {
#pragma omp parallel for schedule(static) if (d_.in.numel() > kParallelWork)
    for (int64_t c = 0; c < d_.in.c; ++c)
      normalise(c, x, r, gamma, beta, double(running_mean[c]),
                1.0 / std::sqrt(double(running_var[c]) + d_.eps), y);
  }

  // Calls f(flat index) for every element of channel c in N, H, W order.
  template <class F>
  void for_channel(int64_t c, F&& f) const {
    for (int64_t n = 0; n < d_.in.n; ++n) {
      const int64_t base = (n * d_.in.c + c) * hw_;
      for (int64_t e = 0; e < hw_; ++e) f(base + e);
    }
  }

  // With a residual r, as an unfused batch norm's output T(v) and then RefAdd.
  void normalise(int64_t c, const T* x, const T* r, const T* gamma, const T* beta, double mean,
                 double invstd, T* y) const {
    const double g = double(gamma[c]) * invstd, b = beta[c];
    const bool relu = d_.relu;
    for_channel(c, [&](int64_t i) {
      const double v = g * (double(x[i]) - mean) + b;
      if (!r) {
        y[i] = T(relu ? relu_value(v) : v);
        return;
      }
      const T s = T(v) + r[i];
      y[i] = relu ? T(relu_value(s)) : s;
    });
  }

  BatchNormDesc d_;
  int64_t hw_, m_;  // m_: values per channel, N*H*W
  double count_ = 0;  // values per channel that the statistics cover: m_, or the group's sum
  std::vector<double> mean_, invstd_;  // batch statistics saved by forward_train for backward
  std::vector<double> sums_;  // per channel, what the group adds: forward's sums (and the
                              // count), then squared deviations; backward's two gradient sums
};

}  // namespace

template <class T>
std::unique_ptr<BatchNormOp<T>> make_batchnorm(const BatchNormDesc& d) {
  d.validate();
  return std::make_unique<RefBatchNorm<T>>(d);
}

template std::unique_ptr<BatchNormOp<float>> make_batchnorm<float>(const BatchNormDesc&);
template std::unique_ptr<BatchNormOp<double>> make_batchnorm<double>(const BatchNormDesc&);

}  // namespace rt::ref
