// Bf16Backend: activation import/export (fp32 NCHW host <-> bf16 NHWC device), gradient
// accumulation in bf16, the fp32 arena's optimizer and gradient checks, and the op factories.
#include "cuda/bf16_backend.h"

#include "cuda/backend.h"
#include "cuda/bf16_conv.h"
#include "cuda/bf16_kernels.h"
#include "cuda/bf16_ops.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/kernels.h"
#include "cuda/memory_spaces.h"
#include "cuda/sgd.h"

namespace rt::cuda {
namespace {

Dims4 dims(const Shape& s) { return {s.n, s.c, s.h, s.w}; }

// The host Sgd (LARS) on the managed arena: waits for the stream before touching it.
class HostSgdAfterSync final : public Optimizer<float> {
 public:
  HostSgdAfterSync(std::vector<ParamInfo> layout, SgdConfig cfg, cudaStream_t stream)
      : sgd_(std::move(layout), cfg), stream_(stream) {}
  void step(float* params, const float* grads, double lr) override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    sgd_.step(params, grads, lr);
  }
  std::span<const float> momentum() const override { return sgd_.momentum(); }
  int64_t steps() const override { return sgd_.steps(); }
  void restore(std::span<const float> m, int64_t steps) override { sgd_.restore(m, steps); }
  size_t size() const override { return sgd_.size(); }

 private:
  Sgd<float> sgd_;
  cudaStream_t stream_;
};

class Bf16Backend final : public Backend<float> {
 public:
  explicit Bf16Backend(const ContextConfig& cfg)
      : ctx_(cfg), device_(ctx_.stream()), managed_(ctx_.stream()) {}
  ~Bf16Backend() override { cudaStreamSynchronize(ctx_.stream()); }

  std::string name() const override { return "cuda-bf16"; }
  size_t act_size(const Shape& s) const override { return bf16_act_floats(s.numel()); }
  // Through an fp32 device staging buffer (grown on first use, then reused: the step allocates
  // nothing); both wait for the stream, as the caller reuses or reads its host buffer next.
  void act_import(const float* nchw, const Shape& s, float* dst) const override {
    const size_t bytes = size_t(s.numel()) * sizeof(float);
    float* stage = staging(bytes);
    CUDA_CHECK(cudaMemcpyAsync(stage, nchw, bytes, cudaMemcpyHostToDevice, ctx_.stream()));
    nchw_f32_to_nhwc_bf16(stage, reinterpret_cast<bf16*>(dst), dims(s), ctx_.stream());
    CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
  }
  void act_export(const float* src, const Shape& s, float* nchw) const override {
    const size_t bytes = size_t(s.numel()) * sizeof(float);
    float* stage = staging(bytes);
    nhwc_bf16_to_nchw_f32(reinterpret_cast<const bf16*>(src), stage, dims(s), ctx_.stream());
    CUDA_CHECK(cudaMemcpyAsync(nchw, stage, bytes, cudaMemcpyDeviceToHost, ctx_.stream()));
    CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
  }
  // n counts floats (act_size units): 2n bf16, sums in fp32 rounded once. The padding past an
  // activation's end is added too; nothing reads it.
  void accumulate(float* y, const float* x, size_t n) const override {
    reduce_add(Elem::bf16, y, x, 2 * n, ctx_.stream());
  }
  const MemorySpace* act_memory() const override { return &device_; }
  const MemorySpace* param_memory() const override { return &managed_; }
  void sync() const override { CUDA_CHECK(cudaStreamSynchronize(ctx_.stream())); }

  // The arena is fp32 as in "cuda": the same fused device SGD (LARS on the host after a sync)
  // and the same one-kernel gradient scale-and-check.
  std::unique_ptr<Optimizer<float>> make_sgd(std::vector<ParamInfo> layout, SgdConfig cfg) override {
    if (cfg.lars) return std::make_unique<HostSgdAfterSync>(std::move(layout), cfg, ctx_.stream());
    return std::make_unique<DeviceSgdOptimizer>(layout, cfg, ctx_.stream());
  }
  size_t scale_count_nonfinite(float* v, size_t n, float s, bool count) override {
    if (!count) {
      if (s != 1.0f) scale(Elem::f32, v, n, s, ctx_.stream());
      return 0;
    }
    CUDA_CHECK(cudaMemsetAsync(flag_.get(), 0, sizeof(int), ctx_.stream()));
    if (s != 1.0f) unscale_check(Elem::f32, v, n, s, flag_.as<int>(), ctx_.stream());
    else nonfinite_check(Elem::f32, v, n, flag_.as<int>(), ctx_.stream());
    int flagged = 0;
    CUDA_CHECK(cudaMemcpyAsync(&flagged, flag_.get(), sizeof(int), cudaMemcpyDeviceToHost,
                               ctx_.stream()));
    CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
    return flagged ? Backend<float>::scale_count_nonfinite(v, n, 1.0f, true) : 0;
  }

  std::unique_ptr<ConvOp<float>> make_conv(const ConvDesc& d) override {
    return std::make_unique<Bf16Conv>(d, ctx_);
  }
  std::unique_ptr<BatchNormOp<float>> make_batchnorm(const BatchNormDesc& d) override {
    return make_bf16_batchnorm(d, ctx_, scratch_);
  }
  std::unique_ptr<ReluOp<float>> make_relu(const ReluDesc& d) override {
    return make_bf16_relu(d, ctx_);
  }
  std::unique_ptr<MaxPoolOp<float>> make_maxpool(const MaxPoolDesc& d) override {
    return make_bf16_maxpool(d, ctx_);
  }
  std::unique_ptr<GlobalAvgPoolOp<float>> make_global_avgpool(const GlobalAvgPoolDesc& d) override {
    return make_bf16_global_avgpool(d, ctx_);
  }
  std::unique_ptr<LinearOp<float>> make_linear(const LinearDesc& d) override {
    return make_bf16_linear(d, ctx_);
  }
  std::unique_ptr<AddOp<float>> make_add(const AddDesc& d) override {
    return make_bf16_add(d, ctx_);
  }
  std::unique_ptr<PadShortcutOp<float>> make_pad_shortcut(const PadShortcutDesc& d) override {
    return make_bf16_pad_shortcut(d, ctx_);
  }
  std::unique_ptr<SoftmaxXentOp<float>> make_softmax_xent(const SoftmaxXentDesc& d) override {
    return make_bf16_softmax_xent(d, ctx_);
  }

 private:
  float* staging(size_t bytes) const {
    if (bytes > staging_.bytes()) {
      CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));  // the old buffer may still be in use
      staging_ = DeviceBuffer();
      staging_ = DeviceBuffer(bytes);
    }
    return staging_.as<float>();
  }

  // Ops keep references to these: a Net destroys its ops and buffers before its backend.
  CudaContext ctx_;
  SharedScratch scratch_;  // batch norm's per-channel partial sums
  DeviceMemorySpace device_;
  ManagedMemorySpace managed_;
  DeviceBuffer flag_{sizeof(int)};      // scale_count_nonfinite's "saw inf or NaN"
  mutable DeviceBuffer staging_;        // act_import / act_export's fp32 NCHW
};

std::unique_ptr<Backend<float>> make_bf16() {
  ContextConfig cfg;
  cfg.device = local_rank_device();
  cfg.benchmark_algos = true;  // as cuda-tf32: the fast configuration
  return make_cuda_bf16_backend(cfg);
}

}  // namespace

std::unique_ptr<Backend<float>> make_cuda_bf16_backend(const ContextConfig& cfg) {
  std::string why;
  if (device_count(&why) == 0) throw Error("backend 'cuda-bf16': no usable CUDA device: " + why);
  return std::make_unique<Bf16Backend>(cfg);
}

void register_bf16_backend() { rt::register_backend("cuda-bf16", &make_bf16); }

}  // namespace rt::cuda
