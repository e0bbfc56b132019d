// Batch normalisation on NHWC 16-bit activations (T = bf16 or f16) with fp32 statistics (PyTorch
// semantics, as nn/ref): the per-channel sums of cuda/lowp_kernels.h, then small per-channel
// kernels. Synchronised (model.bn_group, BatchNormDesc::sync), each of the sums that the CPU
// backends add over the group goes to the host, through BnSync, and back.
#include <memory>

#include "cuda/bn_group_sums.h"
#include "cuda/bn_stats.h"
#include "cuda/check.h"
#include "cuda/lowp_kernels.h"
#include "cuda/lowp_ops.h"
#include "cuda/memory.h"

namespace rt::cuda {
namespace {

template <class T>
class LowpBatchNorm final : public BatchNormOp<float> {
 public:
  LowpBatchNorm(const BatchNormDesc& d, CudaContext& ctx, SharedScratch& scratch)
      : d_(d), ctx_(ctx), scratch_(scratch), stats_(d.in.c) {
    d_.validate();
    rows_ = d_.in.n * d_.in.h * d_.in.w;
    c_ = d_.in.c;
    geom_ = channel_reduce_geom(rows_, c_);
    scratch_.reserve(size_t(2 * geom_.chunks * geom_.channels) * sizeof(float));
    if (d_.sync) group_ = std::make_unique<BnGroupSums>(*d_.sync, c_, ctx_.stream());
  }

  void forward_train(const float* x, const float* gamma, const float* beta, float* y,
                     float* running_mean, float* running_var) override {
    train(x, nullptr, gamma, beta, y, running_mean, running_var);
  }
  void forward_train_add(const float* x, const float* r, const float* gamma, const float* beta,
                         float* y, float* running_mean, float* running_var) override {
    train(x, lowp_data<T>(r), gamma, beta, y, running_mean, running_var);
  }
  void forward_eval(const float* x, const float* gamma, const float* beta,
                    const float* running_mean, const float* running_var, float* y) override {
    eval(x, nullptr, gamma, beta, running_mean, running_var, y);
  }
  void forward_eval_add(const float* x, const float* r, const float* gamma, const float* beta,
                        const float* running_mean, const float* running_var, float* y) override {
    eval(x, lowp_data<T>(r), gamma, beta, running_mean, running_var, y);
  }

  // dbeta and dgamma (fp32, the arena's) are the two per-channel sums; dx then reads them. y is
  // not read: the ReLU's mask is recomputed from x with the forward's mean, scale and beta (with
  // a residual, the caller masked dy, or backward_add_relu masks it). Synchronised, dx reads both sums over the group's batches
  // (and divides by its count); dgamma and dbeta stay this rank's, which the gradient reducer
  // averages, as on the CPU backends.
  void backward(const float* x, const float* gamma, const float* /*y*/, const float* dy,
                float* dx, float* dgamma, float* dbeta) override {
    auto a = saved_args<ChannelSumArgs<T>>(x, dy);
    a.kind = ChannelSum::bn_grad;
    backward_from(a, x, gamma, dy, dx, dgamma, dbeta);
  }
  // The residual's ReLU mask inside the pass that sums dy (ChannelSum::bn_grad_add_relu), which
  // also stores the masked gradient over dy for the residual's branch; dx then reads it.
  bool backward_reads_y() const override { return false; }
  bool masks_add_relu() const override { return d_.residual && d_.relu; }
  void backward_add_relu(const float* x, const float* gamma, const float* y, float* dy, float* dx,
                         float* dgamma, float* dbeta) override {
    RT_SHAPE_CHECK(masks_add_relu(), "layer ", d_.name, ": backward_add_relu without a residual's ReLU");
    auto a = saved_args<ChannelSumArgs<T>>(x, dy);
    a.kind = ChannelSum::bn_grad_add_relu;
    a.out = lowp_data<T>(y);
    a.g_out = lowp_data<T>(dy);
    backward_from(a, x, gamma, dy, dx, dgamma, dbeta);
  }

 private:
  // dbeta and dgamma from a's sums, then dx (from dy as the sums left it).
  void backward_from(ChannelSumArgs<T>& a, const float* x, const float* gamma, const float* dy,
                     float* dx, float* dgamma, float* dbeta) {
    cudaStream_t s = ctx_.stream();
    a.partial = partial();
    channel_sums(a, geom_, dbeta, dgamma, s);
    if (!dx) return;
    auto b = saved_args<BnBackwardArgs<T>>(x, dy);
    b.gamma = gamma;
    b.sum_g = dbeta;
    b.sum_gxhat = dgamma;
    if (d_.sync) {
      group_->dx_sums(dbeta, dgamma, stats_[S::sum_g]);  // sum_g, sum_gxhat: adjacent
      b.sum_g = stats_[S::sum_g];
      b.sum_gxhat = stats_[S::sum_gxhat];
      b.m = count_;
    }
    b.dx = lowp_data<T>(dx);
    bn_backward_dx(b, geom_, s);
  }

  void train(const float* x, const T* r, const float* gamma, const float* beta, float* y,
             float* running_mean, float* running_var) {
    cudaStream_t s = ctx_.stream();
    count_ = d_.sync ? group_stats(lowp_data<T>(x)) : rows_;
    // As PyTorch: the unbiased variance of one value per channel is undefined.
    RT_SHAPE_CHECK(count_ > 1, "layer ", d_.name,
                   ": batch norm training needs more than one value per channel, got input ", d_.in.str(),
                   d_.sync ? " over the group's ranks" : "");
    const BnStatsArgs st = stats_.train_args(d_, count_, gamma, beta, running_mean, running_var);
    if (d_.sync)
      bn_train_stats(st, s);
    else  // the training statistics with the batch's (in one kernel on the vector grid)
      bn_batch_stats(lowp_data<T>(x), geom_, partial(), stats_[S::mean], stats_[S::var_sum], s, &st);
    bn_apply(lowp_data<T>(x), r, stats_[S::mean], stats_[S::scale], stats_[S::beta], lowp_data<T>(y), geom_,
             d_.relu, s);
  }

  void eval(const float* x, const T* r, const float* gamma, const float* beta,
            const float* running_mean, const float* running_var, float* y) {
    // Its own scale buffer: the batch statistics stay valid for a following backward.
    bn_eval_scale(gamma, running_var, d_.eps, stats_[S::eval_scale], c_, ctx_.stream());
    bn_apply(lowp_data<T>(x), r, running_mean, stats_[S::eval_scale], beta, lowp_data<T>(y), geom_,
             d_.relu, ctx_.stream());
  }

  // The group's mean and sum of squared deviations from it into stats_ (BnGroupSums); returns
  // the group's count of values per channel.
  int64_t group_stats(const T* x) {
    ChannelSumArgs<T> a;
    a.x = x;
    a.partial = partial();
    auto sums = [&](ChannelSum kind, const float* mean, float* out) {
      a.kind = kind;
      a.mean = mean;
      channel_sums(a, geom_, out, nullptr, ctx_.stream());
    };
    return group_->mean_and_var_sum(
        rows_, stats_[S::mean], stats_[S::var_sum], [&](float* out) { sums(ChannelSum::x, nullptr, out); },
        [&](const float* mean, float* out) { sums(ChannelSum::sq_dev, mean, out); });
  }

  // What both backward passes read: x, dy, the forward's saved statistics, and whether to mask
  // by the ReLU (not after a residual add: the caller masked dy then).
  template <class Args>
  Args saved_args(const float* x, const float* dy) const {
    Args a;
    a.relu = d_.relu && !d_.residual;
    a.x = lowp_data<T>(x);
    a.dy = lowp_data<T>(dy);
    a.mean = stats_[S::mean];
    a.invstd = stats_[S::invstd];
    a.scale = stats_[S::scale];
    a.beta = stats_[S::beta];
    return a;
  }

  using S = BnChannelStats;
  float* partial() const { return static_cast<float*>(scratch_.get()); }  // reserve() may move it

  BatchNormDesc d_;
  CudaContext& ctx_;
  SharedScratch& scratch_;
  int64_t rows_ = 0, c_ = 0;
  int64_t count_ = 0;  // values per channel the last training forward normalised over (the group's)
  ChannelReduceGeom geom_;
  BnChannelStats stats_;
  std::unique_ptr<BnGroupSums> group_;  // model.bn_group
};

}  // namespace

template <class T>
std::unique_ptr<BatchNormOp<float>> make_lowp_batchnorm(const BatchNormDesc& d, CudaContext& ctx,
                                                        SharedScratch& scratch) {
  return std::make_unique<LowpBatchNorm<T>>(d, ctx, scratch);
}
template std::unique_ptr<BatchNormOp<float>> make_lowp_batchnorm<bf16>(const BatchNormDesc&,
                                                                       CudaContext&,
                                                                       SharedScratch&);
template std::unique_ptr<BatchNormOp<float>> make_lowp_batchnorm<f16>(const BatchNormDesc&,
                                                                      CudaContext&,
                                                                      SharedScratch&);

}  // namespace rt::cuda
