// Batch normalisation on oneDNN, with the ReLU fused (its mask kept in the workspace for
// backward) and PyTorch's running statistics (unbiased variance) updated alongside.
#include "nn/onednn/onednn_common.h"

namespace rt::dnn {
namespace {

using dnnl::normalization_flags;
using dnnl::prop_kind;

class DnnBatchNorm final : public BatchNormOp<float> {
 public:
  DnnBatchNorm(const ContextPtr& ctx, const BatchNormDesc& d)
      : ctx_(ctx), name_(d.name), in_(d.in), c_(d.in.c), count_(d.in.n * d.in.h * d.in.w),
        momentum_(float(d.momentum)) {
    Context& c = *ctx_;
    memory::desc data_md = act_md(d.in), ch_md = vec_md(d.in.c);
    auto flags = normalization_flags::use_scale | normalization_flags::use_shift;
    if (d.relu) flags = flags | normalization_flags::fuse_norm_relu;
    const float eps = float(d.eps);
    auto attr = user_scratchpad_attr();
    try {
      using Fwd = dnnl::batch_normalization_forward;
      using Bwd = dnnl::batch_normalization_backward;
      Fwd::primitive_desc train_pd(Fwd::desc(prop_kind::forward_training, data_md, eps, flags), attr, c.eng);
      Fwd::primitive_desc eval_pd(
          Fwd::desc(prop_kind::forward_inference, data_md, eps, flags | normalization_flags::use_global_stats),
          attr, c.eng);
      Bwd::primitive_desc bwd_pd(Bwd::desc(prop_kind::backward, data_md, data_md, eps, flags), attr, c.eng,
                                 train_pd);

      mean_buf_.resize(size_t(c_));
      var_buf_.resize(size_t(c_));
      x_ = Mem(data_md, c.eng);
      y_ = Mem(data_md, c.eng);
      dx_ = Mem(data_md, c.eng);
      dy_ = Mem(data_md, c.eng);
      scale_ = Mem(ch_md, c.eng);
      shift_ = Mem(ch_md, c.eng);
      dscale_ = Mem(ch_md, c.eng);
      dshift_ = Mem(ch_md, c.eng);
      mean_ = Mem(ch_md, c.eng, mean_buf_.data());
      var_ = Mem(ch_md, c.eng, var_buf_.data());
      run_mean_ = Mem(ch_md, c.eng);
      run_var_ = Mem(ch_md, c.eng);

      train_ = Prim(Fwd(train_pd), train_pd, c);
      train_.arg(DNNL_ARG_SRC, x_).arg(DNNL_ARG_DST, y_).arg(DNNL_ARG_SCALE, scale_)
          .arg(DNNL_ARG_SHIFT, shift_).arg(DNNL_ARG_MEAN, mean_).arg(DNNL_ARG_VARIANCE, var_);
      bwd_ = Prim(Bwd(bwd_pd), bwd_pd, c);
      // oneDNN 2.6 insists on a shift argument for backward although dx does not depend on it.
      unused_shift_buf_.resize(size_t(c_));
      unused_shift_ = Mem(ch_md, c.eng, unused_shift_buf_.data());
      bwd_.arg(DNNL_ARG_SRC, x_).arg(DNNL_ARG_DIFF_DST, dy_).arg(DNNL_ARG_SCALE, scale_)
          .arg(DNNL_ARG_SHIFT, unused_shift_)
          .arg(DNNL_ARG_MEAN, mean_).arg(DNNL_ARG_VARIANCE, var_).arg(DNNL_ARG_DIFF_SRC, dx_)
          .arg(DNNL_ARG_DIFF_SCALE, dscale_).arg(DNNL_ARG_DIFF_SHIFT, dshift_);
      memory::desc ws_md = train_pd.workspace_desc();
      if (ws_md.get_size() > 0) {
        ws_buf_.resize((ws_md.get_size() + sizeof(float) - 1) / sizeof(float));
        ws_ = Mem(ws_md, c.eng, ws_buf_.data());
        train_.arg(DNNL_ARG_WORKSPACE, ws_);
        bwd_.arg(DNNL_ARG_WORKSPACE, ws_);
      }
      eval_ = Prim(Fwd(eval_pd), eval_pd, c);
      eval_.arg(DNNL_ARG_SRC, x_).arg(DNNL_ARG_DST, y_).arg(DNNL_ARG_SCALE, scale_)
          .arg(DNNL_ARG_SHIFT, shift_).arg(DNNL_ARG_MEAN, run_mean_).arg(DNNL_ARG_VARIANCE, run_var_);
    } catch (const dnnl::error& e) {
      throw Error(str_cat("layer ", d.name, ": oneDNN cannot set up batch norm on ", d.in.str(), ": ",
                          e.what()));
    }
  }

  void forward_train(const float* x, const float* gamma, const float* beta, float* y,
                     float* running_mean, float* running_var) override {
    // As PyTorch: the unbiased variance of a single value is undefined.
    RT_SHAPE_CHECK(count_ > 1, "layer ", name_, ": batch norm training needs more than one value per ",
                   "channel, got input ", in_.str());
    Context& c = *ctx_;
    x_.bind(x);
    y_.bind(y);
    scale_.bind(gamma);
    shift_.bind(beta);
    train_.run(c, name_);
    // oneDNN normalises with the biased variance; the running estimate takes the unbiased one.
    const float m = momentum_;
    const float unbias = float(count_) / float(count_ - 1);
    const float* mean = mean_buf_.data();
    const float* var = var_buf_.data();
    for (int64_t i = 0; i < c_; ++i) {
      running_mean[i] = (1.f - m) * running_mean[i] + m * mean[i];
      running_var[i] = (1.f - m) * running_var[i] + m * var[i] * unbias;
    }
  }

  void forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                    const float* running_var, float* y) override {
    x_.bind(x);
    y_.bind(y);
    scale_.bind(gamma);
    shift_.bind(beta);
    run_mean_.bind(running_mean);
    run_var_.bind(running_var);
    eval_.run(*ctx_, name_);
  }

  void backward(const float* x, const float* gamma, const float* y, const float* dy, float* dx,
                float* dgamma, float* dbeta) override {
    if (!dx) {
      // oneDNN always produces dx; a caller that does not want it lends no buffer, so keep one.
      if (dx_spare_.size() == 0) dx_spare_.resize(size_t(in_.numel()));
      dx = dx_spare_.data();
    }
    // The fused ReLU's mask comes from the workspace, so y is not read.
    x_.bind(x);
    scale_.bind(gamma);
    dy_.bind(dy);
    dx_.bind(dx);
    dscale_.bind(dgamma);
    dshift_.bind(dbeta);
    bwd_.run(*ctx_, name_);
  }

 private:
  ContextPtr ctx_;
  std::string name_;
  Shape in_;
  int64_t c_, count_;
  float momentum_;
  Buffer<float> mean_buf_, var_buf_, ws_buf_, dx_spare_, unused_shift_buf_;
  Mem x_, y_, dx_, dy_, scale_, shift_, dscale_, dshift_, mean_, var_, run_mean_, run_var_, ws_, unused_shift_;
  Prim train_, eval_, bwd_;
};

}  // namespace

std::unique_ptr<BatchNormOp<float>> make_batchnorm_op(const ContextPtr& ctx, const BatchNormDesc& d) {
  return std::make_unique<DnnBatchNorm>(ctx, d);
}

}  // namespace rt::dnn
