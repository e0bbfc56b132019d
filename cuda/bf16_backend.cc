// Bf16Backend: activation import/export (fp32 NCHW host <-> bf16 NHWC device), gradient
// accumulation in bf16, the fp32 arena's optimizer and gradient checks, and the op factories.
#include "cuda/bf16_backend.h"

#include "cuda/backend.h"
#include "cuda/bf16_conv.h"
#include "cuda/bf16_kernels.h"
#include "cuda/bf16_ops.h"
#include "cuda/check.h"
#include "cuda/device_backend.h"
#include "cuda/device.h"
#include "cuda/kernels.h"
#include "cuda/memory_spaces.h"
#include "cuda/sgd.h"

namespace rt::cuda {
namespace {

Dims4 dims(const Shape& s) { return {s.n, s.c, s.h, s.w}; }

class Bf16Backend final : public DeviceBackend {
 public:
  explicit Bf16Backend(const ContextConfig& cfg) : DeviceBackend(cfg) {}

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
