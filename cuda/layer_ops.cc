// Device ReLU, residual add, max, windowed and global average pooling, CIFAR padded shortcut, SE
// channel gate, ECA channel convolution.
#include "cuda/layer_ops.h"

#include <climits>

#include "cuda/check.h"
#include "cuda/layer_kernels.h"
#include "cuda/memory.h"

namespace rt::cuda {
namespace {

class DeviceRelu final : public ReluOp<float> {
 public:
  DeviceRelu(const ReluDesc& d, CudaContext& ctx) : n_(d.in.numel()), ctx_(ctx) {}
  void forward(const float* x, float* y) override { relu_forward(x, y, n_, ctx_.stream()); }
  void backward(const float* y, const float* dy, float* dx) override {
    relu_backward(y, dy, dx, n_, ctx_.stream());
  }

 private:
  int64_t n_;
  CudaContext& ctx_;
};

class DeviceAdd final : public AddOp<float> {
 public:
  DeviceAdd(const AddDesc& d, CudaContext& ctx) : n_(d.in.numel()), relu_(d.relu), ctx_(ctx) {}
  void forward(const float* a, const float* b, float* y) override {
    add_forward(a, b, y, n_, relu_, ctx_.stream());
  }
  // Element-wise, each dy[i] read before dx[i] is written: dx may alias dy.
  void backward(const float* y, const float* dy, float* dx) override {
    if (relu_) {
      relu_backward(y, dy, dx, n_, ctx_.stream());
    } else if (dx != dy) {
      CUDA_CHECK(cudaMemcpyAsync(dx, dy, size_t(n_) * sizeof(float), cudaMemcpyDeviceToDevice,
                                 ctx_.stream()));
    }
  }

 private:
  int64_t n_;
  bool relu_;
  CudaContext& ctx_;
};

class DeviceMaxPool final : public MaxPoolOp<float> {
 public:
  DeviceMaxPool(const MaxPoolDesc& d, CudaContext& ctx) : ctx_(ctx) {
    d.validate();
    const Shape o = d.out();
    RT_SHAPE_CHECK(d.in.h * d.in.w <= INT32_MAX, "layer ", d.name, ": input plane ", d.in.str(),
                   " too large for 32-bit argmax indices");
    g_ = {d.in.n * d.in.c, d.in.h, d.in.w, o.h, o.w, d.kernel, d.stride, d.pad};
    argmax_ = DeviceBuffer(size_t(o.numel()) * sizeof(int32_t));
  }
  // The argmax is recorded in evaluation too (it costs one int per output), so backward never
  // has to recompute it.
  void forward(const float* x, float* y, bool) override {
    maxpool_forward(x, y, argmax_.as<int32_t>(), g_, ctx_.stream());
  }
  bool backward_reads_xy() const override { return false; }
  void backward(const float*, const float*, const float* dy, float* dx) override {
    maxpool_backward(argmax_.as<int32_t>(), dy, dx, g_, ctx_.stream());
  }

 private:
  PoolGeom g_;
  CudaContext& ctx_;
  DeviceBuffer argmax_;
};

class DeviceAvgPool final : public AvgPoolOp<float> {
 public:
  DeviceAvgPool(const AvgPoolDesc& d, CudaContext& ctx) : ctx_(ctx) {
    d.validate();
    const Shape o = d.out();
    g_ = {d.in.n * d.in.c, d.in.h, d.in.w, o.h, o.w, d.kernel, d.stride, d.pad};
  }
  void forward(const float* x, float* y) override { window_avgpool_forward(x, y, g_, ctx_.stream()); }
  void backward(const float* dy, float* dx) override {
    window_avgpool_backward(dy, dx, g_, ctx_.stream());
  }

 private:
  PoolGeom g_;
  CudaContext& ctx_;
};

class DeviceGlobalAvgPool final : public GlobalAvgPoolOp<float> {
 public:
  DeviceGlobalAvgPool(const GlobalAvgPoolDesc& d, CudaContext& ctx)
      : planes_(d.in.n * d.in.c), hw_(d.in.h * d.in.w), ctx_(ctx) {
    RT_SHAPE_CHECK(d.in.numel() > 0, "layer ", d.name, ": global average pool of an empty input ",
                   d.in.str());
  }
  void forward(const float* x, float* y) override {
    avgpool_forward(x, y, planes_, hw_, ctx_.stream());
  }
  void backward(const float* dy, float* dx) override {
    avgpool_backward(dy, dx, planes_, hw_, ctx_.stream());
  }

 private:
  int64_t planes_, hw_;
  CudaContext& ctx_;
};

class DevicePadShortcut final : public PadShortcutOp<float> {
 public:
  DevicePadShortcut(const PadShortcutDesc& d, CudaContext& ctx) : ctx_(ctx) {
    d.validate();
    const Shape o = d.out();
    g_ = {d.in.n, d.in.c, d.in.h, d.in.w, o.c, o.h, o.w, d.stride, (d.out_c - d.in.c) / 2};
  }
  void forward(const float* x, float* y) override { pad_shortcut_forward(x, y, g_, ctx_.stream()); }
  void backward(const float* dy, float* dx) override {
    pad_shortcut_backward(dy, dx, g_, ctx_.stream());
  }

 private:
  ShortcutGeom g_;
  CudaContext& ctx_;
};

class DeviceChannelGate final : public ChannelGateOp<float> {
 public:
  DeviceChannelGate(const ChannelGateDesc& d, CudaContext& ctx)
      : planes_(d.in.n * d.in.c), hw_(d.in.h * d.in.w), ctx_(ctx) {
    d.validate();
  }
  void forward(const float* x, const float* g, float* y) override {
    gate_forward(x, g, y, planes_, hw_, ctx_.stream());
  }
  void backward(const float* x, const float* g, const float* dy, float* dx, float* dg) override {
    gate_backward(x, g, dy, dx, dg, planes_, hw_, ctx_.stream());
  }

 private:
  int64_t planes_, hw_;
  CudaContext& ctx_;
};

class DeviceChannelConv final : public ChannelConvOp<float> {
 public:
  DeviceChannelConv(const ChannelConvDesc& d, CudaContext& ctx) : g_{d.in.n, d.in.c, d.kernel}, ctx_(ctx) {
    d.validate();
  }
  void forward(const float* x, const float* w, const float*, float* y) override {
    channel_conv_forward(x, w, y, g_, ctx_.stream());
  }
  void backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float*) override {
    channel_conv_backward(x, w, dy, dx, dw, g_, ctx_.stream());
  }

 private:
  ChannelConvGeom g_;  // NCHW (n, c, 1, 1): n rows of c
  CudaContext& ctx_;
};

}  // namespace

std::unique_ptr<ReluOp<float>> make_device_relu(const ReluDesc& d, CudaContext& ctx) {
  return std::make_unique<DeviceRelu>(d, ctx);
}
std::unique_ptr<AddOp<float>> make_device_add(const AddDesc& d, CudaContext& ctx) {
  return std::make_unique<DeviceAdd>(d, ctx);
}
std::unique_ptr<MaxPoolOp<float>> make_device_maxpool(const MaxPoolDesc& d, CudaContext& ctx) {
  return std::make_unique<DeviceMaxPool>(d, ctx);
}
std::unique_ptr<AvgPoolOp<float>> make_device_avgpool(const AvgPoolDesc& d, CudaContext& ctx) {
  return std::make_unique<DeviceAvgPool>(d, ctx);
}
std::unique_ptr<GlobalAvgPoolOp<float>> make_device_global_avgpool(const GlobalAvgPoolDesc& d,
                                                                   CudaContext& ctx) {
  return std::make_unique<DeviceGlobalAvgPool>(d, ctx);
}
std::unique_ptr<PadShortcutOp<float>> make_device_pad_shortcut(const PadShortcutDesc& d,
                                                               CudaContext& ctx) {
  return std::make_unique<DevicePadShortcut>(d, ctx);
}
std::unique_ptr<ChannelGateOp<float>> make_device_channel_gate(const ChannelGateDesc& d, CudaContext& ctx) {
  return std::make_unique<DeviceChannelGate>(d, ctx);
}
std::unique_ptr<ChannelConvOp<float>> make_device_channel_conv(const ChannelConvDesc& d, CudaContext& ctx) {
  return std::make_unique<DeviceChannelConv>(d, ctx);
}

}  // namespace rt::cuda
