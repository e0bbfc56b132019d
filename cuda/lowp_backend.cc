// LowpBackend<T>: activation import/export (fp32 NCHW host <-> T NHWC device), gradient
// accumulation in T, the fp32 arena's optimizer and gradient checks, and the op factories.
#include "cuda/lowp_backend.h"

#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/device_backend.h"
#include "cuda/drop_path.h"
#include "cuda/kernels.h"
#include "cuda/lowp_conv.h"
#include "cuda/lowp_kernels.h"
#include "cuda/lowp_ops.h"
#include "cuda/memory_spaces.h"
#include "cuda/sgd.h"

namespace rt::cuda {
namespace {

Dims4 dims(const Shape& s) { return {s.n, s.c, s.h, s.w}; }

template <class T>
class LowpBackend final : public DeviceBackend {
 public:
  explicit LowpBackend(const ContextConfig& cfg) : DeviceBackend(cfg) {}

  std::string name() const override { return Lowp<T>::backend; }
  size_t act_size(const Shape& s) const override { return lowp_act_floats(s.numel()); }
  // From the staged copy when there is one; else through an fp32 device buffer (grown on first
  // use, then reused: the step allocates nothing). The caller reuses or reads its host buffer
  // next: an export waits for the stream, an import only when CUDA reads page-locked memory late.
  void act_import(const float* nchw, const Shape& s, float* dst) const override {
    const size_t bytes = size_t(s.numel()) * sizeof(float);
    auto convert = [&](const void* dev) {
      nchw_f32_to_nhwc_lowp(static_cast<const float*>(dev), reinterpret_cast<T*>(dst), dims(s), ctx_.stream());
    };
    if (input_.consume(nchw, bytes, convert)) return;
    float* stage = staging(bytes);
    CUDA_CHECK(cudaMemcpyAsync(stage, nchw, bytes, cudaMemcpyHostToDevice, ctx_.stream()));
    convert(stage);
    // The caller may reuse its buffer on return: wait only where CUDA reads it later.
    if (is_page_locked(nchw)) CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
  }
  // Normalized on the device straight into the 16-bit NHWC input, each value rounded once from
  // the kernel's fp32 (within one 16-bit rounding of the float path, which rounds the host's).
  void act_import_u8(const uint8_t* nhwc, const Shape& s, const NormParams& p, float* dst) const override {
    import_u8(nhwc, s, p, Lowp<T>::elem, dst);
  }
  void act_export(const float* src, const Shape& s, float* nchw) const override {
    act_export_queued(src, s, nchw);
    CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
  }
  // The staging buffer is free again for the next import or export in stream order.
  void act_export_queued(const float* src, const Shape& s, float* nchw) const override {
    const size_t bytes = size_t(s.numel()) * sizeof(float);
    float* stage = staging(bytes);
    nhwc_lowp_to_nchw_f32(reinterpret_cast<const T*>(src), stage, dims(s), ctx_.stream());
    CUDA_CHECK(cudaMemcpyAsync(nchw, stage, bytes, cudaMemcpyDeviceToHost, ctx_.stream()));
  }
  // n counts floats (act_size units): 2n values of T, sums in fp32 rounded once. The padding
  // past an activation's end is added too; nothing reads it.
  void accumulate(float* y, const float* x, size_t n) const override {
    reduce_add(Lowp<T>::elem, y, x, 2 * n, ctx_.stream());
  }
  void accumulate_arena(float* y, const float* x, size_t n) const override {
    reduce_add(Elem::f32, y, x, n, ctx_.stream());
  }
  std::unique_ptr<ConvOp<float>> make_conv(const ConvDesc& d) override {
    return std::make_unique<LowpConv<T>>(d, ctx_);
  }
  std::unique_ptr<BatchNormOp<float>> make_batchnorm(const BatchNormDesc& d) override {
    return make_lowp_batchnorm<T>(d, ctx_, scratch_);  // synchronised too (model.bn_group)
  }
  // Our batch norm kernels read the residual in the pass that writes y (cuda/lowp_bn.cu).
  bool fuses_bn_add() const override { return true; }
  std::unique_ptr<ReluOp<float>> make_relu(const ReluDesc& d) override {
    return make_lowp_relu<T>(d, ctx_);
  }
  std::unique_ptr<MaxPoolOp<float>> make_maxpool(const MaxPoolDesc& d) override {
    return make_lowp_maxpool<T>(d, ctx_);
  }
  std::unique_ptr<GlobalAvgPoolOp<float>> make_global_avgpool(const GlobalAvgPoolDesc& d) override {
    return make_lowp_global_avgpool<T>(d, ctx_);
  }
  std::unique_ptr<AvgPoolOp<float>> make_avgpool(const AvgPoolDesc& d) override {
    return make_lowp_avgpool<T>(d, ctx_);
  }
  std::unique_ptr<LinearOp<float>> make_linear(const LinearDesc& d) override {
    return make_lowp_linear<T>(d, ctx_);
  }
  std::unique_ptr<AddOp<float>> make_add(const AddDesc& d) override {
    return make_lowp_add<T>(d, ctx_);
  }
  std::unique_ptr<PadShortcutOp<float>> make_pad_shortcut(const PadShortcutDesc& d) override {
    return make_lowp_pad_shortcut<T>(d, ctx_);
  }
  std::unique_ptr<SoftmaxXentOp<float>> make_softmax_xent(const SoftmaxXentDesc& d) override {
    return make_lowp_softmax_xent<T>(d, ctx_);
  }
  std::unique_ptr<DropPathOp<float>> make_drop_path(const DropPathDesc& d) override {
    return make_device_drop_path<T>(d, d.in.chw(), ctx_);
  }
  std::unique_ptr<ChannelGateOp<float>> make_channel_gate(const ChannelGateDesc& d) override {
    return make_lowp_channel_gate<T>(d, ctx_);
  }
  std::unique_ptr<ChannelConvOp<float>> make_channel_conv(const ChannelConvDesc& d) override {
    return make_lowp_channel_conv<T>(d, ctx_);
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

template <DType t>
std::unique_ptr<Backend<float>> make_registered(const BackendOptions& o) {
  // Timed by default, as cuda-tf32: the fast configuration.
  return make_cuda_lowp_backend(
      t, context_config(o, t == DType::bf16 ? "cuda-bf16" : "cuda-fp16", true, local_rank_device(o)));
}

template <class T>
std::unique_ptr<Backend<float>> make_checked(const ContextConfig& cfg) {
  std::string why;
  if (device_count(&why) == 0)
    throw Error(str_cat("backend '", Lowp<T>::backend, "': no usable CUDA device: ", why));
  return std::make_unique<LowpBackend<T>>(cfg);
}

}  // namespace

std::unique_ptr<Backend<float>> make_cuda_lowp_backend(DType t, const ContextConfig& cfg) {
  if (t == DType::bf16) return make_checked<bf16>(cfg);
  if (t == DType::f16) return make_checked<f16>(cfg);
  throw Error(str_cat("make_cuda_lowp_backend: ", dtype_name(t), " is not a 16-bit type"));
}

void register_lowp_backends() {
  rt::register_backend("cuda-bf16", &make_registered<DType::bf16>);
  rt::register_backend("cuda-fp16", &make_registered<DType::f16>);
}

}  // namespace rt::cuda
