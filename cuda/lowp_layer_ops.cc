// The 16-bit backends' element-wise, pooling, shortcut, SE gate, ECA channel convolution and loss
// ops: set-up wrappers around cuda/lowp_kernels.h on the context's stream, for T = bf16 and f16.
#include <climits>

#include "cuda/check.h"
#include "cuda/lowp_kernels.h"
#include "cuda/lowp_ops.h"
#include "cuda/memory.h"
#include "cuda/softmax_xent.h"

namespace rt::cuda {
namespace {

template <class T>
class LowpRelu final : public ReluOp<float> {
 public:
  LowpRelu(const ReluDesc& d, CudaContext& ctx) : n_(d.in.numel()), ctx_(ctx) {}
  void forward(const float* x, float* y) override {
    lowp_relu_forward(lowp_data<T>(x), lowp_data<T>(y), n_, ctx_.stream());
  }
  void backward(const float* y, const float* dy, float* dx) override {
    lowp_relu_backward(lowp_data<T>(y), lowp_data<T>(dy), lowp_data<T>(dx), n_, ctx_.stream());
  }

 private:
  int64_t n_;
  CudaContext& ctx_;
};

template <class T>
class LowpAdd final : public AddOp<float> {
 public:
  LowpAdd(const AddDesc& d, CudaContext& ctx) : n_(d.in.numel()), relu_(d.relu), ctx_(ctx) {}
  void forward(const float* a, const float* b, float* y) override {
    lowp_add_forward(lowp_data<T>(a), lowp_data<T>(b), lowp_data<T>(y), n_, relu_, ctx_.stream());
  }
  // Element-wise, each dy[i] read before dx[i] is written: dx may alias dy.
  void backward(const float* y, const float* dy, float* dx) override {
    if (relu_) {
      lowp_relu_backward(lowp_data<T>(y), lowp_data<T>(dy), lowp_data<T>(dx), n_, ctx_.stream());
    } else if (dx != dy) {
      CUDA_CHECK(cudaMemcpyAsync(dx, dy, size_t(n_) * sizeof(T), cudaMemcpyDeviceToDevice,
                                 ctx_.stream()));
    }
  }

 private:
  int64_t n_;
  bool relu_;
  CudaContext& ctx_;
};

template <class T>
class LowpMaxPool final : public MaxPoolOp<float> {
 public:
  LowpMaxPool(const MaxPoolDesc& d, CudaContext& ctx) : ctx_(ctx) {
    d.validate();
    const Shape o = d.out();
    RT_SHAPE_CHECK(d.in.h * d.in.w <= INT32_MAX, "layer ", d.name, ": input plane ", d.in.str(),
                   " too large for 32-bit argmax indices");
    g_ = {d.in.n, d.in.c, d.in.h, d.in.w, o.h, o.w, d.kernel, d.stride, d.pad};
    argmax_ = DeviceBuffer(size_t(o.numel()) * sizeof(int32_t));
  }
  // The argmax is recorded in evaluation too, so backward never recomputes it.
  void forward(const float* x, float* y, bool) override {
    lowp_maxpool_forward(lowp_data<T>(x), lowp_data<T>(y), argmax_.as<int32_t>(), g_, ctx_.stream());
  }
  bool backward_reads_xy() const override { return false; }
  void backward(const float*, const float*, const float* dy, float* dx) override {
    lowp_maxpool_backward(argmax_.as<int32_t>(), lowp_data<T>(dy), lowp_data<T>(dx), g_, ctx_.stream());
  }

 private:
  NhwcPoolGeom g_;
  CudaContext& ctx_;
  DeviceBuffer argmax_;
};

template <class T>
class LowpAvgPool final : public AvgPoolOp<float> {
 public:
  LowpAvgPool(const AvgPoolDesc& d, CudaContext& ctx) : ctx_(ctx) {
    d.validate();
    const Shape o = d.out();
    g_ = {d.in.n, d.in.c, d.in.h, d.in.w, o.h, o.w, d.kernel, d.stride, d.pad};
  }
  void forward(const float* x, float* y) override {
    lowp_window_avgpool_forward(lowp_data<T>(x), lowp_data<T>(y), g_, ctx_.stream());
  }
  void backward(const float* dy, float* dx) override {
    lowp_window_avgpool_backward(lowp_data<T>(dy), lowp_data<T>(dx), g_, ctx_.stream());
  }

 private:
  NhwcPoolGeom g_;
  CudaContext& ctx_;
};

template <class T>
class LowpGlobalAvgPool final : public GlobalAvgPoolOp<float> {
 public:
  LowpGlobalAvgPool(const GlobalAvgPoolDesc& d, CudaContext& ctx)
      : n_(d.in.n), c_(d.in.c), hw_(d.in.h * d.in.w), ctx_(ctx) {
    RT_SHAPE_CHECK(d.in.numel() > 0, "layer ", d.name, ": global average pool of an empty input ",
                   d.in.str());
  }
  void forward(const float* x, float* y) override {
    lowp_avgpool_forward(lowp_data<T>(x), lowp_data<T>(y), n_, c_, hw_, ctx_.stream());
  }
  void backward(const float* dy, float* dx) override {
    lowp_avgpool_backward(lowp_data<T>(dy), lowp_data<T>(dx), n_, c_, hw_, ctx_.stream());
  }

 private:
  int64_t n_, c_, hw_;
  CudaContext& ctx_;
};

template <class T>
class LowpChannelGate final : public ChannelGateOp<float> {
 public:
  LowpChannelGate(const ChannelGateDesc& d, CudaContext& ctx)
      : n_(d.in.n), c_(d.in.c), hw_(d.in.h * d.in.w), ctx_(ctx) {
    d.validate();
  }
  void forward(const float* x, const float* g, float* y) override {
    lowp_gate_forward(lowp_data<T>(x), lowp_data<T>(g), lowp_data<T>(y), n_, c_, hw_, ctx_.stream());
  }
  void backward(const float* x, const float* g, const float* dy, float* dx, float* dg) override {
    lowp_gate_backward(lowp_data<T>(x), lowp_data<T>(g), lowp_data<T>(dy), lowp_data<T>(dx), lowp_data<T>(dg),
                       n_, c_, hw_, ctx_.stream());
  }

 private:
  int64_t n_, c_, hw_;
  CudaContext& ctx_;
};

// An (n, c, 1, 1) tensor in NHWC is n rows of c values, as in NCHW (act_size(in) / n, a count of
// floats padded at the tensor's end, is not their distance). A null dx stays null.
template <class T>
class LowpChannelConv final : public ChannelConvOp<float> {
 public:
  LowpChannelConv(const ChannelConvDesc& d, CudaContext& ctx) : g_{d.in.n, d.in.c, d.kernel}, ctx_(ctx) {
    d.validate();
  }
  void forward(const float* x, const float* w, const float*, float* y) override {
    channel_conv_forward(lowp_data<T>(x), w, lowp_data<T>(y), g_, ctx_.stream());
  }
  void backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float*) override {
    channel_conv_backward(lowp_data<T>(x), w, lowp_data<T>(dy), lowp_data<T>(dx), dw, g_,
                          ctx_.stream());
  }

 private:
  ChannelConvGeom g_;
  CudaContext& ctx_;
};

template <class T>
class LowpPadShortcut final : public PadShortcutOp<float> {
 public:
  LowpPadShortcut(const PadShortcutDesc& d, CudaContext& ctx) : ctx_(ctx) {
    d.validate();
    const Shape o = d.out();
    g_ = {d.in.n, d.in.c, d.in.h, d.in.w, o.c, o.h, o.w, d.stride, (d.out_c - d.in.c) / 2};
  }
  void forward(const float* x, float* y) override {
    lowp_pad_shortcut_forward(lowp_data<T>(x), lowp_data<T>(y), g_, ctx_.stream());
  }
  void backward(const float* dy, float* dx) override {
    lowp_pad_shortcut_backward(lowp_data<T>(dy), lowp_data<T>(dx), g_, ctx_.stream());
  }

 private:
  ShortcutGeom g_;
  CudaContext& ctx_;
};

// Logits (n, k, 1, 1) are the same in NHWC and NCHW: [n][k].
template <class T>
class LowpSoftmaxXent final : public SoftmaxXentOp<float> {
 public:
  LowpSoftmaxXent(const SoftmaxXentDesc& d, CudaContext& ctx)
      : inner_(d, ctx.stream()), stream_(ctx.stream()), n_(d.in.n), k_(d.in.c),
        logits32_(size_t(d.in.n * d.in.c) * sizeof(float)),
        dlogits32_(size_t(d.in.n * d.in.c) * sizeof(float)) {}
  void forward(const float* logits, const Targets& t) override {
    lowp_to_f32(lowp_data<T>(logits), logits32_.as<float>(), n_ * k_, stream_);
    inner_.forward(logits32_.as<float>(), t);
  }
  double loss() override { return inner_.loss(); }
  void backward(const Targets& t, float* dlogits, double scale) override {
    inner_.backward(t, dlogits32_.as<float>(), scale);
    f32_to_lowp(dlogits32_.as<float>(), lowp_data<T>(dlogits), n_ * k_, stream_);
  }

 private:
  DeviceSoftmaxXent inner_;
  cudaStream_t stream_;
  int64_t n_, k_;
  DeviceBuffer logits32_, dlogits32_;
};

}  // namespace

template <class T>
std::unique_ptr<ReluOp<float>> make_lowp_relu(const ReluDesc& d, CudaContext& ctx) {
  return std::make_unique<LowpRelu<T>>(d, ctx);
}
template <class T>
std::unique_ptr<AddOp<float>> make_lowp_add(const AddDesc& d, CudaContext& ctx) {
  return std::make_unique<LowpAdd<T>>(d, ctx);
}
template <class T>
std::unique_ptr<MaxPoolOp<float>> make_lowp_maxpool(const MaxPoolDesc& d, CudaContext& ctx) {
  return std::make_unique<LowpMaxPool<T>>(d, ctx);
}
template <class T>
std::unique_ptr<AvgPoolOp<float>> make_lowp_avgpool(const AvgPoolDesc& d, CudaContext& ctx) {
  return std::make_unique<LowpAvgPool<T>>(d, ctx);
}
template <class T>
std::unique_ptr<GlobalAvgPoolOp<float>> make_lowp_global_avgpool(const GlobalAvgPoolDesc& d,
                                                                 CudaContext& ctx) {
  return std::make_unique<LowpGlobalAvgPool<T>>(d, ctx);
}
template <class T>
std::unique_ptr<PadShortcutOp<float>> make_lowp_pad_shortcut(const PadShortcutDesc& d,
                                                             CudaContext& ctx) {
  return std::make_unique<LowpPadShortcut<T>>(d, ctx);
}
template <class T>
std::unique_ptr<ChannelGateOp<float>> make_lowp_channel_gate(const ChannelGateDesc& d, CudaContext& ctx) {
  return std::make_unique<LowpChannelGate<T>>(d, ctx);
}
template <class T>
std::unique_ptr<ChannelConvOp<float>> make_lowp_channel_conv(const ChannelConvDesc& d, CudaContext& ctx) {
  return std::make_unique<LowpChannelConv<T>>(d, ctx);
}
template <class T>
std::unique_ptr<SoftmaxXentOp<float>> make_lowp_softmax_xent(const SoftmaxXentDesc& d,
                                                             CudaContext& ctx) {
  return std::make_unique<LowpSoftmaxXent<T>>(d, ctx);
}

#define RT_LOWP_INSTANTIATE(T)                                                                  \
  template std::unique_ptr<ReluOp<float>> make_lowp_relu<T>(const ReluDesc&, CudaContext&);     \
  template std::unique_ptr<AddOp<float>> make_lowp_add<T>(const AddDesc&, CudaContext&);        \
  template std::unique_ptr<MaxPoolOp<float>> make_lowp_maxpool<T>(const MaxPoolDesc&,           \
                                                                  CudaContext&);                \
  template std::unique_ptr<AvgPoolOp<float>> make_lowp_avgpool<T>(const AvgPoolDesc&,           \
                                                                  CudaContext&);                \
  template std::unique_ptr<GlobalAvgPoolOp<float>> make_lowp_global_avgpool<T>(                 \
      const GlobalAvgPoolDesc&, CudaContext&);                                                  \
  template std::unique_ptr<PadShortcutOp<float>> make_lowp_pad_shortcut<T>(                     \
      const PadShortcutDesc&, CudaContext&);                                                    \
  template std::unique_ptr<SoftmaxXentOp<float>> make_lowp_softmax_xent<T>(                     \
      const SoftmaxXentDesc&, CudaContext&);                                                    \
  template std::unique_ptr<ChannelGateOp<float>> make_lowp_channel_gate<T>(const ChannelGateDesc&, \
                                                                           CudaContext&);         \
  template std::unique_ptr<ChannelConvOp<float>> make_lowp_channel_conv<T>(const ChannelConvDesc&, \
                                                                           CudaContext&);
RT_LOWP_INSTANTIATE(bf16)
RT_LOWP_INSTANTIATE(f16)
#undef RT_LOWP_INSTANTIATE

}  // namespace rt::cuda
