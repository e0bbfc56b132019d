// Batch normalisation on NHWC 16-bit activations (T = bf16 or f16) with fp32 statistics (PyTorch
// semantics, as nn/ref): the per-channel sums of cuda/lowp_kernels.h, then small per-channel
// kernels. Synchronised (model.bn_group, BatchNormDesc::sync), each of the sums that the CPU
// backends add over the group goes to the host, through BnSync, and back.
#include <initializer_list>
#include <vector>

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
    if (d_.sync) {
      host_ = static_cast<float*>(pinned_malloc(size_t(2 * c_) * sizeof(float)));
      sums_.resize(size_t(2 * c_ + 1));
    }
  }
  ~LowpBatchNorm() override {
    if (host_) pinned_free(host_, size_t(2 * c_) * sizeof(float));
  }
  LowpBatchNorm(const LowpBatchNorm&) = delete;
  LowpBatchNorm& operator=(const LowpBatchNorm&) = delete;

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
  // a residual, the caller masked dy). Synchronised, dx reads both sums over the group's batches
  // (and divides by its count); dgamma and dbeta stay this rank's, which the gradient reducer
  // averages, as on the CPU backends.
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
    if (d_.sync) {
      group_sums({dbeta, dgamma}, false);
      to_device(buf(kSumG), 2 * c_, 1.0);  // kSumG, kSumGxhat: adjacent
      b.sum_g = buf(kSumG);
      b.sum_gxhat = buf(kSumGxhat);
      b.m = count_;
    }
    b.dx = lowp_data<T>(dx);
    bn_backward_dx(b, geom_, s);
  }

 private:
  void train(const float* x, const T* r, const float* gamma, const float* beta, float* y,
             float* running_mean, float* running_var) {
    cudaStream_t s = ctx_.stream();
    if (d_.sync) {
      group_stats(lowp_data<T>(x));
    } else {
      count_ = rows_;
      check_count();
      bn_batch_stats(lowp_data<T>(x), geom_, partial(), buf(kMean), buf(kVarSum), s);
    }
    BnStatsArgs st;
    st.channels = c_;
    st.m = count_;
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

  // As PyTorch: the unbiased variance of one value per channel is undefined.
  void check_count() const {
    RT_SHAPE_CHECK(count_ > 1, "layer ", d_.name,
                   ": batch norm training needs more than one value per channel, got input ", d_.in.str(),
                   d_.sync ? " over the group's ranks" : "");
  }

  // The group's mean and sum of squared deviations from it into kMean and kVarSum: two passes,
  // as the CPU backends take them, each pass's per-channel sums added over the group.
  void group_stats(const T* x) {
    ChannelSumArgs<T> a;
    a.kind = ChannelSum::x;
    a.x = x;
    a.partial = partial();
    channel_sums(a, geom_, buf(kMean), nullptr, ctx_.stream());
    group_sums({buf(kMean)}, true);
    count_ = int64_t(sums_[size_t(c_)]);
    check_count();
    to_device(buf(kMean), c_, 1.0 / double(count_));
    a.kind = ChannelSum::sq_dev;
    a.mean = buf(kMean);
    channel_sums(a, geom_, buf(kVarSum), nullptr, ctx_.stream());
    group_sums({buf(kVarSum)}, false);
    to_device(buf(kVarSum), c_, 1.0);
  }

  // Adds per-channel fp32 sums (c_ floats each, on the device) over the group, in double as the
  // CPU backends do, into sums_ (one after the other; this rank's row count after them when
  // asked). The host waits for the stream: a layer's kernels after it need the group's figures.
  void group_sums(std::initializer_list<const float*> parts, bool with_count) {
    cudaStream_t s = ctx_.stream();
    size_t n = 0;
    for (const float* p : parts) {
      CUDA_CHECK(cudaMemcpyAsync(host_ + n, p, size_t(c_) * sizeof(float), cudaMemcpyDeviceToHost, s));
      n += size_t(c_);
    }
    CUDA_CHECK(cudaStreamSynchronize(s));
    for (size_t i = 0; i < n; ++i) sums_[i] = host_[i];
    if (with_count) sums_[n++] = double(rows_);
    d_.sync->sum(sums_.data(), n);
  }

  // sums_[0, n) times k, rounded to fp32, to `to` on the device. Queued on the stream from the
  // page-locked buffer, which the host writes again only after the next group_sums' wait.
  void to_device(float* to, int64_t n, double k) {
    for (size_t i = 0; i < size_t(n); ++i) host_[i] = float(sums_[i] * k);
    CUDA_CHECK(cudaMemcpyAsync(to, host_, size_t(n) * sizeof(float), cudaMemcpyHostToDevice, ctx_.stream()));
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
  // kSumG, kSumGxhat: backward's sums over the group (model.bn_group).
  enum Buffer { kMean, kVarSum, kInvStd, kScale, kBeta, kEvalScale, kSumG, kSumGxhat, kBuffers };
  float* buf(Buffer b) const { return stats_.as<float>() + int64_t(b) * c_; }
  float* partial() const { return static_cast<float*>(scratch_.get()); }  // reserve() may move it

  BatchNormDesc d_;
  CudaContext& ctx_;
  SharedScratch& scratch_;
  int64_t rows_ = 0, c_ = 0;
  int64_t count_ = 0;  // values per channel the last training forward normalised over (the group's)
  ChannelReduceGeom geom_;
  DeviceBuffer stats_;
  float* host_ = nullptr;     // page-locked, 2 c_ floats (model.bn_group)
  std::vector<double> sums_;  // 2 c_ + 1: what BnSync adds
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
