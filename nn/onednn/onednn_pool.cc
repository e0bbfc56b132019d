// The oneDNN backend's pooling layers: max pooling (with workspace) and windowed average pooling.
#include "nn/onednn/onednn_common.h"

namespace rt::dnn {
namespace {

using dnnl::algorithm;
using dnnl::prop_kind;

class DnnMaxPool final : public MaxPoolOp<float> {
 public:
  DnnMaxPool(const ContextPtr& ctx, const MaxPoolDesc& d) : ctx_(ctx), name_(d.name) {
    Context& c = *ctx_;
    memory::desc src_md = act_md(d.in, c.block), dst_md = act_md(d.out(), c.block);
    Dims k{d.kernel, d.kernel}, s{d.stride, d.stride}, p{d.pad, d.pad};
    auto attr = user_scratchpad_attr();
    try {
      using Fwd = dnnl::pooling_forward;
      using Bwd = dnnl::pooling_backward;
      Fwd::primitive_desc train_pd(
          Fwd::desc(prop_kind::forward_training, algorithm::pooling_max, src_md, dst_md, s, k, p, p), attr,
          c.eng);
      Fwd::primitive_desc eval_pd(
          Fwd::desc(prop_kind::forward_inference, algorithm::pooling_max, src_md, dst_md, s, k, p, p), attr,
          c.eng);
      Bwd::primitive_desc bwd_pd(Bwd::desc(algorithm::pooling_max, src_md, dst_md, s, k, p, p), attr, c.eng,
                                 train_pd);
      x_ = Mem(src_md, c.eng);
      y_ = Mem(dst_md, c.eng);
      dx_ = Mem(src_md, c.eng);
      dy_ = Mem(dst_md, c.eng);
      memory::desc ws_md = train_pd.workspace_desc();
      ws_buf_.resize((ws_md.get_size() + sizeof(float) - 1) / sizeof(float));
      ws_ = Mem(ws_md, c.eng, ws_buf_.data());
      train_ = Prim(Fwd(train_pd), train_pd, c);
      train_.arg(DNNL_ARG_SRC, x_).arg(DNNL_ARG_DST, y_).arg(DNNL_ARG_WORKSPACE, ws_);
      eval_ = Prim(Fwd(eval_pd), eval_pd, c);
      eval_.arg(DNNL_ARG_SRC, x_).arg(DNNL_ARG_DST, y_);
      bwd_ = Prim(Bwd(bwd_pd), bwd_pd, c);
      bwd_.arg(DNNL_ARG_DIFF_DST, dy_).arg(DNNL_ARG_WORKSPACE, ws_).arg(DNNL_ARG_DIFF_SRC, dx_);
    } catch (const dnnl::error& e) {
      throw Error(str_cat("layer ", d.name, ": oneDNN cannot set up max pooling on ", d.in.str(), ": ",
                          e.what()));
    }
  }

  void forward(const float* x, float* y, bool train) override {
    x_.bind(x);
    y_.bind(y);
    (train ? train_ : eval_).run(*ctx_, name_);
  }

  // The workspace records which window element won (the first maximum), so x and y are unused.
  bool backward_reads_xy() const override { return false; }
  void backward(const float* x, const float* y, const float* dy, float* dx) override {
    dy_.bind(dy);
    dx_.bind(dx);
    bwd_.run(*ctx_, name_);
  }

 private:
  ContextPtr ctx_;
  std::string name_;
  Buffer<float> ws_buf_;
  Mem x_, y_, dx_, dy_, ws_;
  Prim train_, eval_, bwd_;
};

// Average pooling, padding not counted (pooling_avg_exclude_padding). PyTorch's ceil_mode is a
// right padding that completes the last window: oneDNN counts it as padding too.
class DnnAvgPool final : public AvgPoolOp<float> {
 public:
  DnnAvgPool(const ContextPtr& ctx, const AvgPoolDesc& d) : ctx_(ctx), name_(d.name) {
    Context& c = *ctx_;
    const Shape out = d.out();
    memory::desc src_md = act_md(d.in, c.block), dst_md = act_md(out, c.block);
    Dims k{d.kernel, d.kernel}, s{d.stride, d.stride}, pl{d.pad, d.pad};
    Dims pr{(out.h - 1) * d.stride + d.kernel - d.in.h - d.pad, (out.w - 1) * d.stride + d.kernel - d.in.w - d.pad};
    auto attr = user_scratchpad_attr();
    const auto alg = algorithm::pooling_avg_exclude_padding;
    try {
      using Fwd = dnnl::pooling_forward;
      using Bwd = dnnl::pooling_backward;
      Fwd::primitive_desc fwd_pd(Fwd::desc(prop_kind::forward_training, alg, src_md, dst_md, s, k, pl, pr), attr,
                                 c.eng);
      Bwd::primitive_desc bwd_pd(Bwd::desc(alg, src_md, dst_md, s, k, pl, pr), attr, c.eng, fwd_pd);
      x_ = Mem(src_md, c.eng);
      y_ = Mem(dst_md, c.eng);
      dx_ = Mem(src_md, c.eng);
      dy_ = Mem(dst_md, c.eng);
      fwd_ = Prim(Fwd(fwd_pd), fwd_pd, c);
      fwd_.arg(DNNL_ARG_SRC, x_).arg(DNNL_ARG_DST, y_);
      bwd_ = Prim(Bwd(bwd_pd), bwd_pd, c);
      bwd_.arg(DNNL_ARG_DIFF_DST, dy_).arg(DNNL_ARG_DIFF_SRC, dx_);
    } catch (const dnnl::error& e) {
      throw Error(str_cat("layer ", d.name, ": oneDNN cannot set up average pooling on ", d.in.str(), ": ",
                          e.what()));
    }
  }

  void forward(const float* x, float* y) override {
    x_.bind(x);
    y_.bind(y);
    fwd_.run(*ctx_, name_);
  }
  void backward(const float* dy, float* dx) override {
    dy_.bind(dy);
    dx_.bind(dx);
    bwd_.run(*ctx_, name_);
  }

 private:
  ContextPtr ctx_;
  std::string name_;
  Mem x_, y_, dx_, dy_;
  Prim fwd_, bwd_;
};

}  // namespace

std::unique_ptr<MaxPoolOp<float>> make_maxpool_op(const ContextPtr& ctx, const MaxPoolDesc& d) {
  return std::make_unique<DnnMaxPool>(ctx, d);
}
std::unique_ptr<AvgPoolOp<float>> make_avgpool_op(const ContextPtr& ctx, const AvgPoolDesc& d) {
  return std::make_unique<DnnAvgPool>(ctx, d);
}

}  // namespace rt::dnn
