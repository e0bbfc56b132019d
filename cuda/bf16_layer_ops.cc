// The bf16 backend's element-wise, pooling, shortcut and loss ops: set-up wrappers around
// cuda/bf16_kernels.h on the context's stream.
#include <climits>

#include "cuda/bf16_kernels.h"
#include "cuda/bf16_ops.h"
#include "cuda/check.h"
#include "cuda/memory.h"
#include "cuda/softmax_xent.h"

namespace rt::cuda {
namespace {

const bf16* as_bf16(const float* p) { return reinterpret_cast<const bf16*>(p); }
bf16* as_bf16(float* p) { return reinterpret_cast<bf16*>(p); }

class Bf16Relu final : public ReluOp<float> {
 public:
  Bf16Relu(const ReluDesc& d, CudaContext& ctx) : n_(d.in.numel()), ctx_(ctx) {}
  void forward(const float* x, float* y) override {
    bf16_relu_forward(as_bf16(x), as_bf16(y), n_, ctx_.stream());
  }
  void backward(const float* y, const float* dy, float* dx) override {
    bf16_relu_backward(as_bf16(y), as_bf16(dy), as_bf16(dx), n_, ctx_.stream());
  }

 private:
  int64_t n_;
  CudaContext& ctx_;
};

class Bf16Add final : public AddOp<float> {
 public:
  Bf16Add(const AddDesc& d, CudaContext& ctx) : n_(d.in.numel()), relu_(d.relu), ctx_(ctx) {}
  void forward(const float* a, const float* b, float* y) override {
    bf16_add_forward(as_bf16(a), as_bf16(b), as_bf16(y), n_, relu_, ctx_.stream());
  }
  // Element-wise, each dy[i] read before dx[i] is written: dx may alias dy.
  void backward(const float* y, const float* dy, float* dx) override {
    if (relu_) {
      bf16_relu_backward(as_bf16(y), as_bf16(dy), as_bf16(dx), n_, ctx_.stream());
    } else if (dx != dy) {
      CUDA_CHECK(cudaMemcpyAsync(dx, dy, size_t(n_) * sizeof(bf16), cudaMemcpyDeviceToDevice,
                                 ctx_.stream()));
    }
  }

 private:
  int64_t n_;
  bool relu_;
  CudaContext& ctx_;
};

class Bf16MaxPool final : public MaxPoolOp<float> {
 public:
  Bf16MaxPool(const MaxPoolDesc& d, CudaContext& ctx) : ctx_(ctx) {
    d.validate();
    const Shape o = d.out();
    RT_SHAPE_CHECK(d.in.h * d.in.w <= INT32_MAX, "layer ", d.name, ": input plane ", d.in.str(),
                   " too large for 32-bit argmax indices");
    g_ = {d.in.n, d.in.c, d.in.h, d.in.w, o.h, o.w, d.kernel, d.stride, d.pad};
    argmax_ = DeviceBuffer(size_t(o.numel()) * sizeof(int32_t));
  }
  // The argmax is recorded in evaluation too, so backward never recomputes it.
  void forward(const float* x, float* y, bool) override {
    bf16_maxpool_forward(as_bf16(x), as_bf16(y), argmax_.as<int32_t>(), g_, ctx_.stream());
  }
  void backward(const float*, const float*, const float* dy, float* dx) override {
    bf16_maxpool_backward(argmax_.as<int32_t>(), as_bf16(dy), as_bf16(dx), g_, ctx_.stream());
  }

 private:
  NhwcPoolGeom g_;
  CudaContext& ctx_;
  DeviceBuffer argmax_;
};

class Bf16GlobalAvgPool final : public GlobalAvgPoolOp<float> {
 public:
  Bf16GlobalAvgPool(const GlobalAvgPoolDesc& d, CudaContext& ctx)
      : n_(d.in.n), c_(d.in.c), hw_(d.in.h * d.in.w), ctx_(ctx) {
    RT_SHAPE_CHECK(d.in.numel() > 0, "layer ", d.name, ": global average pool of an empty input ",
                   d.in.str());
  }
  void forward(const float* x, float* y) override {
    bf16_avgpool_forward(as_bf16(x), as_bf16(y), n_, c_, hw_, ctx_.stream());
  }
  void backward(const float* dy, float* dx) override {
    bf16_avgpool_backward(as_bf16(dy), as_bf16(dx), n_, c_, hw_, ctx_.stream());
  }

 private:
  int64_t n_, c_, hw_;
  CudaContext& ctx_;
};

class Bf16PadShortcut final : public PadShortcutOp<float> {
 public:
  Bf16PadShortcut(const PadShortcutDesc& d, CudaContext& ctx) : ctx_(ctx) {
    d.validate();
    const Shape o = d.out();
    g_ = {d.in.n, d.in.c, d.in.h, d.in.w, o.c, o.h, o.w, d.stride, (d.out_c - d.in.c) / 2};
  }
  void forward(const float* x, float* y) override {
    bf16_pad_shortcut_forward(as_bf16(x), as_bf16(y), g_, ctx_.stream());
  }
  void backward(const float* dy, float* dx) override {
    bf16_pad_shortcut_backward(as_bf16(dy), as_bf16(dx), g_, ctx_.stream());
  }

 private:
  ShortcutGeom g_;
  CudaContext& ctx_;
};

// Logits (n, k, 1, 1) are the same in NHWC and NCHW: [n][k].
class Bf16SoftmaxXent final : public SoftmaxXentOp<float> {
 public:
  Bf16SoftmaxXent(const SoftmaxXentDesc& d, CudaContext& ctx)
      : inner_(d, ctx.stream()), stream_(ctx.stream()), n_(d.in.n), k_(d.in.c),
        labels_(size_t(d.in.n) * sizeof(int32_t)),
        logits32_(size_t(d.in.n * d.in.c) * sizeof(float)),
        dlogits32_(size_t(d.in.n * d.in.c) * sizeof(float)) {}
  double forward(const float* logits, const int32_t* labels) override {
    CUDA_CHECK(cudaMemcpyAsync(labels_.get(), labels, size_t(n_) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream_));
    bf16_to_f32(as_bf16(logits), logits32_.as<float>(), n_ * k_, stream_);
    return inner_.forward(logits32_.as<float>(), labels_.as<int32_t>());  // waits for the stream
  }
  void backward(const int32_t*, float* dlogits, double scale) override {
    inner_.backward(labels_.as<int32_t>(), dlogits32_.as<float>(), scale);
    f32_to_bf16(dlogits32_.as<float>(), as_bf16(dlogits), n_ * k_, stream_);
  }

 private:
  DeviceSoftmaxXent inner_;
  cudaStream_t stream_;
  int64_t n_, k_;
  DeviceBuffer labels_, logits32_, dlogits32_;
};

}  // namespace

std::unique_ptr<ReluOp<float>> make_bf16_relu(const ReluDesc& d, CudaContext& ctx) {
  return std::make_unique<Bf16Relu>(d, ctx);
}
std::unique_ptr<AddOp<float>> make_bf16_add(const AddDesc& d, CudaContext& ctx) {
  return std::make_unique<Bf16Add>(d, ctx);
}
std::unique_ptr<MaxPoolOp<float>> make_bf16_maxpool(const MaxPoolDesc& d, CudaContext& ctx) {
  return std::make_unique<Bf16MaxPool>(d, ctx);
}
std::unique_ptr<GlobalAvgPoolOp<float>> make_bf16_global_avgpool(const GlobalAvgPoolDesc& d,
                                                                 CudaContext& ctx) {
  return std::make_unique<Bf16GlobalAvgPool>(d, ctx);
}
std::unique_ptr<PadShortcutOp<float>> make_bf16_pad_shortcut(const PadShortcutDesc& d,
                                                             CudaContext& ctx) {
  return std::make_unique<Bf16PadShortcut>(d, ctx);
}
std::unique_ptr<SoftmaxXentOp<float>> make_bf16_softmax_xent(const SoftmaxXentDesc& d,
                                                             CudaContext& ctx) {
  return std::make_unique<Bf16SoftmaxXent>(d, ctx);
}

}  // namespace rt::cuda
