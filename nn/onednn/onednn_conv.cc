// Convolution and fully connected layers on oneDNN: forward, backward-data and backward-weights
// primitives set up once; weights reordered from the arena's canonical layout into the
// primitives' preferred blocked layouts before each use, weight gradients reordered back.
#include "nn/onednn/onednn_common.h"
#include "nn/onednn/winograd.h"

namespace rt::dnn {
namespace {

using dnnl::algorithm;
using dnnl::prop_kind;
using dt = memory::data_type;

// A weight tensor as one primitive wants it: bound straight to the arena when the preferred
// layout is the canonical one, otherwise staged in Context::weights by a reorder. Each staged
// copy is needed only while its one primitive runs, so all layers share that buffer.
struct WeightView {
  Mem mem;
  Reorder reorder;
  bool direct = false;

  // to_prim: the reorder goes arena -> primitive layout (weights); otherwise the reverse
  // (weight gradients).
  void set_up(const memory::desc& canonical, const memory::desc& preferred, Context& ctx, bool to_prim) {
    direct = preferred == canonical;
    mem = Mem(preferred, ctx.eng);
    if (direct) return;
    ctx.reserve_weights(preferred.get_size());
    reorder = to_prim ? Reorder(canonical, preferred, ctx) : Reorder(preferred, canonical, ctx);
  }
  // Makes the primitive's memory hold the arena weights w.
  void load(Context& ctx, const std::string& layer, const float* w) {
    if (direct) {
      mem.bind(w);
      return;
    }
    mem.bind(ctx.weights.data());
    reorder.run(ctx, layer, w, ctx.weights.data());
  }
  // Before the primitive writes the gradient: where to write it.
  void prepare_store(Context& ctx, float* dw) { mem.bind(direct ? dw : ctx.weights.data()); }
  // After it: moves the gradient into the arena.
  void store(Context& ctx, const std::string& layer, float* dw) {
    if (!direct) reorder.run(ctx, layer, ctx.weights.data(), dw);
  }
};

// Forward, backward-data and backward-weights primitives of a layer with weights and an
// optional bias (convolution, inner product): the derived class sets them up, this runs them.
template <class OpBase>
class DnnWeighted : public OpBase {
 public:
  DnnWeighted(const ContextPtr& ctx, const std::string& name) : ctx_(ctx), name_(name) {}

  void forward(const float* x, const float* w, const float* b, float* y) override {
    Context& c = *ctx_;
    wf_.load(c, name_, w);
    x_.bind(x);
    y_.bind(y);
    if (b_) b_.bind(b);
    fwd_.run(c, name_);
  }

  void backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                float* db) override {
    Context& c = *ctx_;
    dy_.bind(dy);
    if (dx) {
      wd_.load(c, name_, w);
      dx_.bind(dx);
      bwd_data_.run(c, name_);
    }
    x_.bind(x);
    dw_.prepare_store(c, dw);
    if (db_) db_.bind(db);
    bwd_w_.run(c, name_);
    dw_.store(c, name_, dw);
  }

 protected:
  ContextPtr ctx_;
  std::string name_;
  Mem x_, y_, dx_, dy_, b_, db_;
  WeightView wf_, wd_, dw_;
  Prim fwd_, bwd_data_, bwd_w_;
};

class DnnConv final : public DnnWeighted<ConvOp<float>> {
 public:
  DnnConv(const ContextPtr& ctx, const ConvDesc& d) : DnnWeighted(ctx, d.name) {
    Context& c = *ctx_;
    const Shape out = d.out();
    memory::desc src_md = act_md(d.in), dst_md = act_md(out);
    Dims wdims{d.out_c, d.in.c, d.kernel_h, d.kernel_w};
    memory::desc w_any(wdims, dt::f32, Tag::any), w_plain(wdims, dt::f32, Tag::oihw);
    memory::desc b_md = d.bias ? vec_md(d.out_c) : memory::desc();
    Dims strides{d.stride_h, d.stride_w}, pad{d.pad_h, d.pad_w};
    // Symmetric padding as in PyTorch: the output size check in oneDNN floors the same way.
    auto attr = user_scratchpad_attr();
    try {
      dnnl::convolution_forward::primitive_desc fpd(
          dnnl::convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct,
                                          src_md, w_any, b_md, dst_md, strides, pad, pad),
          attr, c.eng);
      dnnl::convolution_backward_data::primitive_desc bdpd(
          dnnl::convolution_backward_data::desc(algorithm::convolution_direct, src_md, w_any, dst_md,
                                                strides, pad, pad),
          attr, c.eng, fpd);
      dnnl::convolution_backward_weights::primitive_desc bwpd(
          dnnl::convolution_backward_weights::desc(algorithm::convolution_direct, src_md, w_any, b_md,
                                                   dst_md, strides, pad, pad),
          attr, c.eng, fpd);

      x_ = Mem(src_md, c.eng);
      y_ = Mem(dst_md, c.eng);
      dx_ = Mem(src_md, c.eng);
      dy_ = Mem(dst_md, c.eng);
      if (d.bias) {
        b_ = Mem(b_md, c.eng);
        db_ = Mem(b_md, c.eng);
      }
      wf_.set_up(w_plain, fpd.weights_desc(), c, true);
      wd_.set_up(w_plain, bdpd.weights_desc(), c, true);
      dw_.set_up(w_plain, bwpd.diff_weights_desc(), c, false);

      fwd_ = Prim(dnnl::convolution_forward(fpd), fpd, c);
      fwd_.arg(DNNL_ARG_SRC, x_).arg(DNNL_ARG_WEIGHTS, wf_.mem).arg(DNNL_ARG_DST, y_);
      if (d.bias) fwd_.arg(DNNL_ARG_BIAS, b_);
      bwd_data_ = Prim(dnnl::convolution_backward_data(bdpd), bdpd, c);
      bwd_data_.arg(DNNL_ARG_DIFF_DST, dy_).arg(DNNL_ARG_WEIGHTS, wd_.mem).arg(DNNL_ARG_DIFF_SRC, dx_);
      bwd_w_ = Prim(dnnl::convolution_backward_weights(bwpd), bwpd, c);
      bwd_w_.arg(DNNL_ARG_SRC, x_).arg(DNNL_ARG_DIFF_DST, dy_).arg(DNNL_ARG_DIFF_WEIGHTS, dw_.mem);
      if (d.bias) bwd_w_.arg(DNNL_ARG_DIFF_BIAS, db_);
    } catch (const dnnl::error& e) {
      throw Error(str_cat("layer ", d.name, ": oneDNN cannot set up convolution ", d.in.str(), " -> ",
                          out.str(), ": ", e.what()));
    }
  }
};

// Inner product: the input keeps its activation layout (nChw8c or plain); the weights follow
// whatever layout oneDNN pairs with it.
class DnnLinear final : public DnnWeighted<LinearOp<float>> {
 public:
  DnnLinear(const ContextPtr& ctx, const LinearDesc& d) : DnnWeighted(ctx, d.name) {
    Context& c = *ctx_;
    const Shape out = d.out();
    const bool flat = d.in.h * d.in.w == 1;
    // (n, c, 1, 1) activations are plain, so they are 2-D to oneDNN; the weights follow suit.
    memory::desc src_md = flat ? memory::desc({d.in.n, d.in.c}, dt::f32, Tag::nc) : act_md(d.in);
    Dims wdims = flat ? Dims{d.out_features, d.in.c} : Dims{d.out_features, d.in.c, d.in.h, d.in.w};
    memory::desc w_any(wdims, dt::f32, Tag::any),
        w_plain(wdims, dt::f32, flat ? Tag::oi : Tag::oihw);
    memory::desc dst_md({out.n, out.c}, dt::f32, Tag::nc);
    memory::desc b_md = d.bias ? vec_md(d.out_features) : memory::desc();
    auto attr = user_scratchpad_attr();
    try {
      dnnl::inner_product_forward::primitive_desc fpd(
          dnnl::inner_product_forward::desc(prop_kind::forward_training, src_md, w_any, b_md, dst_md),
          attr, c.eng);
      dnnl::inner_product_backward_data::primitive_desc bdpd(
          dnnl::inner_product_backward_data::desc(src_md, w_any, dst_md), attr, c.eng, fpd);
      dnnl::inner_product_backward_weights::primitive_desc bwpd(
          dnnl::inner_product_backward_weights::desc(src_md, w_any, b_md, dst_md), attr, c.eng, fpd);
      x_ = Mem(src_md, c.eng);
      y_ = Mem(dst_md, c.eng);
      dx_ = Mem(src_md, c.eng);
      dy_ = Mem(dst_md, c.eng);
      if (d.bias) {
        b_ = Mem(b_md, c.eng);
        db_ = Mem(b_md, c.eng);
      }
      wf_.set_up(w_plain, fpd.weights_desc(), c, true);
      wd_.set_up(w_plain, bdpd.weights_desc(), c, true);
      dw_.set_up(w_plain, bwpd.diff_weights_desc(), c, false);
      fwd_ = Prim(dnnl::inner_product_forward(fpd), fpd, c);
      fwd_.arg(DNNL_ARG_SRC, x_).arg(DNNL_ARG_WEIGHTS, wf_.mem).arg(DNNL_ARG_DST, y_);
      if (d.bias) fwd_.arg(DNNL_ARG_BIAS, b_);
      bwd_data_ = Prim(dnnl::inner_product_backward_data(bdpd), bdpd, c);
      bwd_data_.arg(DNNL_ARG_DIFF_DST, dy_).arg(DNNL_ARG_WEIGHTS, wd_.mem).arg(DNNL_ARG_DIFF_SRC, dx_);
      bwd_w_ = Prim(dnnl::inner_product_backward_weights(bwpd), bwpd, c);
      bwd_w_.arg(DNNL_ARG_SRC, x_).arg(DNNL_ARG_DIFF_DST, dy_).arg(DNNL_ARG_DIFF_WEIGHTS, dw_.mem);
      if (d.bias) bwd_w_.arg(DNNL_ARG_DIFF_BIAS, db_);
    } catch (const dnnl::error& e) {
      throw Error(str_cat("layer ", d.name, ": oneDNN cannot set up fully connected ", d.in.str(),
                          " -> ", out.str(), ": ", e.what()));
    }
  }
};

}  // namespace

std::unique_ptr<ConvOp<float>> make_conv_op(const ContextPtr& ctx, const ConvDesc& d, ConvAlgo algo) {
  const bool wino = algo == ConvAlgo::winograd ? winograd_applies(d)
                    : algo == ConvAlgo::automatic ? winograd_pays(d)
                                                  : false;
  if (wino) return make_winograd_conv_op(ctx, d);
  return std::make_unique<DnnConv>(ctx, d);
}

std::unique_ptr<LinearOp<float>> make_linear_op(const ContextPtr& ctx, const LinearDesc& d) {
  return std::make_unique<DnnLinear>(ctx, d);
}

}  // namespace rt::dnn
