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

// An activation as one primitive sees it: the caller's buffer itself, or (when the primitive runs
// on another layout, see other_layout_if_ref) a copy in that layout, reordered in before the call
// or out after it. A copy lives only during its primitive's call, so every layer's copies share
// the context's two staging buffers (slot 0 and 1: a call needs at most two at once).
struct ActView {
  Mem mem;
  Reorder reorder;
  int slot = -1;  // -1: no copy, the caller's buffer is bound

  void set_up(const memory::desc& act, const memory::desc& used, Context& ctx, bool input, int stage) {
    mem = Mem(used, ctx.eng);
    if (act == used) return;
    slot = stage;
    ctx.reserve_stage(slot, used.get_size());
    reorder = input ? Reorder(act, used, ctx) : Reorder(used, act, ctx);
  }
  void in(Context& ctx, const std::string& layer, const float* p) {
    if (slot < 0) return mem.bind(p);
    mem.bind(ctx.stage[slot].data());
    reorder.run(ctx, layer, p, ctx.stage[slot].data());
  }
  void out_begin(Context& ctx, float* p) { mem.bind(slot < 0 ? p : ctx.stage[slot].data()); }
  void out_end(Context& ctx, const std::string& layer, float* p) {
    if (slot >= 0) reorder.run(ctx, layer, ctx.stage[slot].data(), p);
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
    xf_.in(c, name_, x);
    yf_.out_begin(c, y);
    if (b_) b_.bind(b);
    fwd_.run(c, name_);
    yf_.out_end(c, name_, y);
  }

  void backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                float* db) override {
    Context& c = *ctx_;
    if (dx) {
      wd_.load(c, name_, w);
      dyd_.in(c, name_, dy);
      dxd_.out_begin(c, dx);
      bwd_data_.run(c, name_);
      dxd_.out_end(c, name_, dx);
    }
    xw_.in(c, name_, x);
    dyw_.in(c, name_, dy);
    dw_.prepare_store(c, dw);
    if (db_) db_.bind(db);
    bwd_w_.run(c, name_);
    dw_.store(c, name_, dw);
  }

 protected:
  // Once the primitive descriptors are made: the bias buffers (bias: b_md), the weights' views in
  // each direction's layout from w_plain (ours), and the three primitives with their arguments.
  // The activation views (xf_ ... dyw_) are the layer's to set up, before.
  template <class Fwd, class Bwd, class Bww>
  void wire(Context& c, const memory::desc& w_plain, const memory::desc& b_md, bool bias,
            const typename Fwd::primitive_desc& fpd, const typename Bwd::primitive_desc& bdpd,
            const typename Bww::primitive_desc& bwpd) {
    if (bias) {
      b_ = Mem(b_md, c.eng);
      db_ = Mem(b_md, c.eng);
    }
    wf_.set_up(w_plain, fpd.weights_desc(), c, true);
    wd_.set_up(w_plain, bdpd.weights_desc(), c, true);
    dw_.set_up(w_plain, bwpd.diff_weights_desc(), c, false);
    fwd_ = Prim(Fwd(fpd), fpd, c);
    fwd_.arg(DNNL_ARG_SRC, xf_.mem).arg(DNNL_ARG_WEIGHTS, wf_.mem).arg(DNNL_ARG_DST, yf_.mem);
    if (bias) fwd_.arg(DNNL_ARG_BIAS, b_);
    bwd_data_ = Prim(Bwd(bdpd), bdpd, c);
    bwd_data_.arg(DNNL_ARG_DIFF_DST, dyd_.mem).arg(DNNL_ARG_WEIGHTS, wd_.mem).arg(DNNL_ARG_DIFF_SRC, dxd_.mem);
    bwd_w_ = Prim(Bww(bwpd), bwpd, c);
    bwd_w_.arg(DNNL_ARG_SRC, xw_.mem).arg(DNNL_ARG_DIFF_DST, dyw_.mem).arg(DNNL_ARG_DIFF_WEIGHTS, dw_.mem);
    if (bias) bwd_w_.arg(DNNL_ARG_DIFF_BIAS, db_);
  }

  ContextPtr ctx_;
  std::string name_;
  ActView xf_, yf_, dyd_, dxd_, xw_, dyw_;  // per primitive: forward, backward data, weights
  Mem b_, db_;
  WeightView wf_, wd_, dw_;
  Prim fwd_, bwd_data_, bwd_w_;
};

bool is_reference_impl(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str()).rfind("ref", 0) == 0;
}

// oneDNN 2.6 has no optimised kernel for some convolutions on the blocked activations: a 3x3
// backward-weights on 2x2 maps, a blocked input whose output is 1x1 and hence plain, or groups of
// fewer channels than the block (ResNeXt's first stage, 4 a group). It then falls back to its
// reference loops, 100-1000x slower (a ResNet-50 step at 64x64 took 2.3 s instead of 0.1 s).
// For such a primitive make(layout) builds it on copies of the activations in another layout:
// NHWC, where oneDNN's direct kernels take small groups (ResNeXt-50's 4-channel groups at
// 56x56: 0.13 s instead of 0.34 s for the three directions with GEMM), else plain NCHW, where its
// GEMM-based kernel applies. The reorders in and out cost little beside that.
enum class Layout { act, nhwc, nchw };
constexpr const char* layout_note(Layout l) {
  return l == Layout::nhwc ? " (nhwc)" : l == Layout::nchw ? " (plain)" : "";
}

template <class PD, class Make>
PD other_layout_if_ref(const Make& make, Layout* used) {
  PD pd = make(Layout::act);
  *used = Layout::act;
  if (!is_reference_impl(pd)) return pd;
  for (Layout l : {Layout::nhwc, Layout::nchw}) {
    PD alt = make(l);
    if (is_reference_impl(alt)) continue;
    *used = l;
    return alt;
  }
  return pd;
}

class DnnConv final : public DnnWeighted<ConvOp<float>> {
 public:
  // alg: convolution_direct, or convolution_winograd (oneDNN's own, on AVX-512 only: its
  // pds then fail to build elsewhere, and the constructor throws).
  DnnConv(const ContextPtr& ctx, const ConvDesc& d, algorithm alg = algorithm::convolution_direct)
      : DnnWeighted(ctx, d.name) {
    Context& c = *ctx_;
    const Shape out = d.out();
    const memory::desc src_md = act_md(d.in, c.block), dst_md = act_md(out, c.block);
    auto md = [&c](const Shape& s, Layout l) {
      if (l == Layout::act) return act_md(s, c.block);
      return memory::desc({s.n, s.c, s.h, s.w}, dt::f32, l == Layout::nhwc ? Tag::nhwc : Tag::nchw);
    };
    // Grouped weights are 5-D to oneDNN, [groups][out_c / groups][in_c / groups][kh][kw]: the
    // arena's [out_c][in_c / groups][kh][kw] with its first dimension split.
    const bool grouped = d.groups > 1;
    Dims wdims = grouped ? Dims{d.groups, d.out_c / d.groups, d.in_per_group(), d.kernel_h, d.kernel_w}
                         : Dims{d.out_c, d.in.c, d.kernel_h, d.kernel_w};
    memory::desc w_any(wdims, dt::f32, Tag::any),
        w_plain(wdims, dt::f32, grouped ? Tag::goihw : Tag::oihw);
    memory::desc b_md = d.bias ? vec_md(d.out_c) : memory::desc();
    Dims strides{d.stride_h, d.stride_w}, pad{d.pad_h, d.pad_w};
    // Symmetric padding as in PyTorch: the output size check in oneDNN floors the same way.
    auto attr = user_scratchpad_attr();
    using Fwd = dnnl::convolution_forward::primitive_desc;
    using BwdD = dnnl::convolution_backward_data::primitive_desc;
    using BwdW = dnnl::convolution_backward_weights::primitive_desc;
    auto fwd_pd = [&](Layout l) {
      return Fwd(dnnl::convolution_forward::desc(prop_kind::forward_training, alg,
                                                 md(d.in, l), w_any, b_md, md(out, l), strides, pad, pad),
                 attr, c.eng);
    };
    try {
      Layout fl, dl, wl;
      Fwd fpd = other_layout_if_ref<Fwd>(fwd_pd, &fl);
      BwdD bdpd = other_layout_if_ref<BwdD>(
          [&](Layout l) {
            return BwdD(dnnl::convolution_backward_data::desc(alg, md(d.in, l),
                                                              w_any, md(out, l), strides, pad, pad),
                        attr, c.eng, fwd_pd(l));
          },
          &dl);
      BwdW bwpd = other_layout_if_ref<BwdW>(
          [&](Layout l) {
            return BwdW(dnnl::convolution_backward_weights::desc(alg, md(d.in, l),
                                                                 w_any, b_md, md(out, l), strides, pad, pad),
                        attr, c.eng, fwd_pd(l));
          },
          &wl);
      // The descs the primitives were created with (a pd may report an equivalent desc that
      // does not compare equal, which must not cost a copy).
      xf_.set_up(src_md, md(d.in, fl), c, true, 0);
      yf_.set_up(dst_md, md(out, fl), c, false, 1);
      dyd_.set_up(dst_md, md(out, dl), c, true, 0);
      dxd_.set_up(src_md, md(d.in, dl), c, false, 1);
      xw_.set_up(src_md, md(d.in, wl), c, true, 0);
      dyw_.set_up(dst_md, md(out, wl), c, true, 1);
      wire<dnnl::convolution_forward, dnnl::convolution_backward_data, dnnl::convolution_backward_weights>(
          c, w_plain, b_md, d.bias, fpd, bdpd, bwpd);
      impls_ = str_cat(fpd.impl_info_str(), layout_note(fl), " / ", bdpd.impl_info_str(), layout_note(dl),
                       " / ", bwpd.impl_info_str(), layout_note(wl));
    } catch (const dnnl::error& e) {
      throw Error(str_cat("layer ", d.name, ": oneDNN cannot set up convolution ", d.in.str(), " -> ",
                          out.str(), ": ", e.what()));
    }
  }
  const std::string& impls() const { return impls_; }

 private:
  std::string impls_;
};

// Inner product: the input keeps its activation layout (blocked or plain); the weights follow
// whatever layout oneDNN pairs with it.
class DnnLinear final : public DnnWeighted<LinearOp<float>> {
 public:
  DnnLinear(const ContextPtr& ctx, const LinearDesc& d) : DnnWeighted(ctx, d.name) {
    Context& c = *ctx_;
    const Shape out = d.out();
    const bool flat = d.in.h * d.in.w == 1;
    // (n, c, 1, 1) activations are plain, so they are 2-D to oneDNN; the weights follow suit.
    memory::desc src_md = flat ? memory::desc({d.in.n, d.in.c}, dt::f32, Tag::nc) : act_md(d.in, c.block);
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
      xf_.set_up(src_md, src_md, c, true, 0);
      yf_.set_up(dst_md, dst_md, c, false, 1);
      dyd_.set_up(dst_md, dst_md, c, true, 0);
      dxd_.set_up(src_md, src_md, c, false, 1);
      xw_.set_up(src_md, src_md, c, true, 0);
      dyw_.set_up(dst_md, dst_md, c, true, 1);
      wire<dnnl::inner_product_forward, dnnl::inner_product_backward_data,
           dnnl::inner_product_backward_weights>(c, w_plain, b_md, d.bias, fpd, bdpd, bwpd);
    } catch (const dnnl::error& e) {
      throw Error(str_cat("layer ", d.name, ": oneDNN cannot set up fully connected ", d.in.str(),
                          " -> ", out.str(), ": ", e.what()));
    }
  }
};

}  // namespace

// Winograd: ours (F(2x2, 3x3), AVX2 transforms) reads 8-channel blocks; on 16-channel blocks
// (AVX-512) oneDNN has its own, F(4x4, 3x3) (jit_wino_4x3), 1.3-2.4x its direct kernels per
// direction on ResNet's 3x3 layers, taken by the same rule where oneDNN can build it.
std::unique_ptr<ConvOp<float>> make_conv_op(const ContextPtr& ctx, const ConvDesc& d, ConvAlgo algo) {
  if (ctx->block == 16) {
    if (algo == ConvAlgo::automatic && winograd_pays(d)) {
      try {
        return std::make_unique<DnnConv>(ctx, d, algorithm::convolution_winograd);
      } catch (const Error&) {  // not on this processor or shape: direct, below
      }
    }
    return std::make_unique<DnnConv>(ctx, d);
  }
  const bool wino = algo == ConvAlgo::winograd ? winograd_applies(d)
                    : algo == ConvAlgo::automatic ? winograd_pays(d)
                                                  : false;
  if (wino) return make_winograd_conv_op(ctx, d);
  return std::make_unique<DnnConv>(ctx, d);
}

std::string conv_impls(const ConvOp<float>& op) {
  auto* c = dynamic_cast<const DnnConv*>(&op);
  return c ? c->impls() : std::string("winograd");  // make_conv_op makes no third kind
}

std::unique_ptr<LinearOp<float>> make_linear_op(const ContextPtr& ctx, const LinearDesc& d) {
  return std::make_unique<DnnLinear>(ctx, d);
}

}  // namespace rt::dnn
