// Forward: the group's mean (Σx and the row count added over the group), its squared deviations
// from that mean (added too), then the statistics and the normalisation; backward: the rank's
// Σg and Σg·x̂ (dβ and dγ, which the gradient reducer averages), added over the group for dx. As
// nn/ref's synchronised batch norm; evaluation uses the running statistics and no group.
#include "cuda/sync_batchnorm.h"

#include "cuda/bn_group_sums.h"
#include "cuda/bn_stats.h"
#include "cuda/lowp_kernels.h"  // bn_train_stats, bn_eval_scale: per-channel, any layout
#include "cuda/sync_bn.h"

namespace rt::cuda {
namespace {

class SyncBatchNorm final : public BatchNormOp<float> {
 public:
  SyncBatchNorm(const BatchNormDesc& d, CudaContext& ctx) : d_(d), ctx_(ctx), stats_(d.in.c) {
    d_.validate();
    if (!d_.sync || d_.residual)
      throw Error(str_cat("layer ", d_.name, ": make_sync_batchnorm needs a group and no residual"));
    g_ = {d_.in.n, d_.in.c, d_.in.h * d_.in.w};
    group_ = std::make_unique<BnGroupSums>(*d_.sync, g_.c, ctx_.stream());
  }

  void forward_train(const float* x, const float* gamma, const float* beta, float* y, float* running_mean,
                     float* running_var) override {
    cudaStream_t s = ctx_.stream();
    auto sums = [&](NchwSum kind, const float* mean, float* out) {
      NchwSumArgs a;
      a.kind = kind;
      a.x = x;
      a.mean = mean;
      a.s1 = out;
      nchw_channel_sums(a, g_, s);
    };
    count_ = group_->mean_and_var_sum(
        g_.n * g_.hw, stats_[S::mean], stats_[S::var_sum], [&](float* out) { sums(NchwSum::x, nullptr, out); },
        [&](const float* mean, float* out) { sums(NchwSum::sq_dev, mean, out); });
    RT_SHAPE_CHECK(count_ > 1, "layer ", d_.name,
                   ": batch norm training needs more than one value per channel, got input ", d_.in.str(),
                   " over the group's ranks");
    bn_train_stats(stats_.train_args(d_, count_, gamma, beta, running_mean, running_var), s);
    nchw_bn_apply(x, stats_[S::mean], stats_[S::scale], beta, y, g_, d_.relu, s);
  }

  void forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                    const float* running_var, float* y) override {
    bn_eval_scale(gamma, running_var, d_.eps, stats_[S::eval_scale], g_.c, ctx_.stream());
    nchw_bn_apply(x, running_mean, stats_[S::eval_scale], beta, y, g_, d_.relu, ctx_.stream());
  }

  void backward(const float* x, const float* gamma, const float* y, const float* dy, float* dx, float* dgamma,
                float* dbeta) override {
    cudaStream_t s = ctx_.stream();
    NchwSumArgs a;
    a.kind = NchwSum::grad;
    a.x = x;
    a.dy = dy;
    a.y = d_.relu ? y : nullptr;
    a.mean = stats_[S::mean];
    a.invstd = stats_[S::invstd];
    a.s1 = dbeta;
    a.s2 = dgamma;
    nchw_channel_sums(a, g_, s);
    if (!dx) return;
    group_->dx_sums(dbeta, dgamma, stats_[S::sum_g]);  // sum_g, sum_gxhat: adjacent
    NchwBnDxArgs b;
    b.x = x;
    b.dy = dy;
    b.y = a.y;
    b.gamma = gamma;
    b.mean = stats_[S::mean];
    b.invstd = stats_[S::invstd];
    b.sum_g = stats_[S::sum_g];
    b.sum_gxhat = stats_[S::sum_gxhat];
    b.m = count_;
    b.dx = dx;
    nchw_bn_dx(b, g_, s);
  }

 private:
  using S = BnChannelStats;

  BatchNormDesc d_;
  CudaContext& ctx_;
  NchwBnGeom g_;
  int64_t count_ = 0;  // the group's values per channel in the last training forward
  BnChannelStats stats_;
  std::unique_ptr<BnGroupSums> group_;
};

}  // namespace

std::unique_ptr<BatchNormOp<float>> make_sync_batchnorm(const BatchNormDesc& d, CudaContext& ctx) {
  return std::make_unique<SyncBatchNorm>(d, ctx);
}

}  // namespace rt::cuda
