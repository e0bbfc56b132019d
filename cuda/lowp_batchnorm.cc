// Batch normalisation on NHWC 16-bit activations (T = bf16 or f16) with fp32 statistics (PyTorch
// semantics, as nn/ref): the per-channel sums of cuda/lowp_kernels.h, then small per-channel
// kernels.
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
      : d_(d), ctx_(ctx), scratch_(scratch) {
    d_.validate();
    rows_ = d_.in.n * d_.in.h * d_.in.w;
    c_ = d_.in.c;
    geom_ = channel_reduce_geom(rows_, c_);
    scratch_.reserve(size_t(2 * geom_.chunks * geom_.channels) * sizeof(float));
    stats_ = DeviceBuffer(size_t(kBuffers * c_) * sizeof(float));
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
  // a residual, the caller masked dy).
  void backward(const float* x, const float* gamma, const float* /*y*/, const float* dy,
                float* dx, float* dgamma, float* dbeta) override {
    cudaStream_t s = ctx_.stream();
    auto a = saved_args<ChannelSumArgs<T>>(x, dy);
    a.kind = ChannelSum::bn_grad;
    a.partial = partial();
    channel_sums(a, geom_, dbeta, dgamma, s);
    if (!dx) return;
    auto b = saved_args<BnBackwardArgs<T>>(x, dy);
    b.gamma = gamma;
    b.sum_g = dbeta;
    b.sum_gxhat = dgamma;
    b.dx = lowp_data<T>(dx);
    bn_backward_dx(b, geom_, s);
  }

 private:
  void train(const float* x, const T* r, const float* gamma, const float* beta, float* y,
             float* running_mean, float* running_var) {
    // As PyTorch: the unbiased variance of one value per channel is undefined.
    RT_SHAPE_CHECK(rows_ > 1, "layer ", d_.name,
                   ": batch norm training needs more than one value per channel, got input ",
                   d_.in.str());
    cudaStream_t s = ctx_.stream();
    bn_batch_stats(lowp_data<T>(x), geom_, partial(), buf(kMean), buf(kVarSum), s);
    BnStatsArgs st;
    st.channels = c_;
    st.m = rows_;
    st.eps = d_.eps;
    st.momentum = d_.momentum;
    st.gamma = gamma;
    st.beta = beta;
    st.mean = buf(kMean);
    st.var_sum = buf(kVarSum);
    st.invstd = buf(kInvStd);
    st.scale = buf(kScale);
    st.beta_saved = buf(kBeta);
    st.running_mean = running_mean;
    st.running_var = running_var;
    bn_train_stats(st, s);
    bn_apply(lowp_data<T>(x), r, buf(kMean), buf(kScale), buf(kBeta), lowp_data<T>(y), geom_,
             d_.relu, s);
  }

  void eval(const float* x, const T* r, const float* gamma, const float* beta,
            const float* running_mean, const float* running_var, float* y) {
    // Its own scale buffer: the batch statistics stay valid for a following backward.
    bn_eval_scale(gamma, running_var, d_.eps, buf(kEvalScale), c_, ctx_.stream());
    bn_apply(lowp_data<T>(x), r, running_mean, buf(kEvalScale), beta, lowp_data<T>(y), geom_,
             d_.relu, ctx_.stream());
  }

  // What both backward passes read: x, dy, the forward's saved statistics, and whether to mask
  // by the ReLU (not after a residual add: the caller masked dy then).
  template <class Args>
  Args saved_args(const float* x, const float* dy) const {
    Args a;
    a.relu = d_.relu && !d_.residual;
    a.x = lowp_data<T>(x);
    a.dy = lowp_data<T>(dy);
    a.mean = buf(kMean);
    a.invstd = buf(kInvStd);
    a.scale = buf(kScale);
    a.beta = buf(kBeta);
    return a;
  }

  // Per-channel fp32 vectors in stats_.
  enum Buffer { kMean, kVarSum, kInvStd, kScale, kBeta, kEvalScale, kBuffers };
  float* buf(Buffer b) const { return stats_.as<float>() + int64_t(b) * c_; }
  float* partial() const { return static_cast<float*>(scratch_.get()); }  // reserve() may move it

  BatchNormDesc d_;
  CudaContext& ctx_;
  SharedScratch& scratch_;
  int64_t rows_ = 0, c_ = 0;
  ChannelReduceGeom geom_;
  DeviceBuffer stats_;
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
