// CudaBackend ("cuda", "cuda-tf32"): NCHW fp32 activation import/export and the op factories, on
// DeviceBackend (device_backend.h: where memory lives, the device optimizer and gradient pass).
//
// Activations and their gradients are device memory the host never reads (act_import /
// act_export copy them). So is the arena: the step's passes over it (the gradient reduction
// through comm::DeviceGrads, the scale-and-check, the SGD update) run on the device, while
// checkpoints, consistency checks and fault diagnosis read it through host copies.
#include "cuda/backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <string>

#include "cuda/lowp_backend.h"
#include "cuda/check.h"
#include "cuda/cublas_linear.h"
#include "cuda/cudnn_batchnorm.h"
#include "cuda/sync_batchnorm.h"
#include "cuda/cudnn_conv.h"
#include "cuda/device.h"
#include "cuda/device_backend.h"
#include "cuda/drop_path.h"
#include "cuda/kernels.h"
#include "cuda/layer_ops.h"
#include "cuda/sgd.h"
#include "cuda/softmax_xent.h"

namespace rt::cuda {
namespace {

class CudaBackend final : public DeviceBackend {
 public:
  explicit CudaBackend(const ContextConfig& cfg) : DeviceBackend(cfg) {}

  std::string name() const override { return "cuda"; }
  size_t act_size(const Shape& s) const override { return size_t(s.numel()); }
  // A staged input is copied on the device; otherwise uploaded, and waited for only from
  // page-locked memory (the caller reuses its host buffer right after).
  void act_import(const float* nchw, const Shape& s, float* dst) const override {
    const size_t bytes = size_t(s.numel()) * sizeof(float);
    if (input_.consume(nchw, bytes, [&](const void* dev) {
          CUDA_CHECK(cudaMemcpyAsync(dst, dev, bytes, cudaMemcpyDeviceToDevice, ctx_.stream()));
        }))
      return;
    CUDA_CHECK(cudaMemcpyAsync(dst, nchw, bytes, cudaMemcpyHostToDevice, ctx_.stream()));
    // The caller may reuse its buffer on return: wait only where CUDA reads it later.
    if (is_page_locked(nchw)) CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
  }
  void act_import_u8(const uint8_t* nhwc, const Shape& s, const NormParams& p, float* dst) const override {
    import_u8(nhwc, s, p, Elem::f32, dst);
  }
  // Waits for the stream: the caller reads its host buffer right after.
  void act_export(const float* src, const Shape& s, float* nchw) const override {
    act_export_queued(src, s, nchw);
    CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
  }
  void act_export_queued(const float* src, const Shape& s, float* nchw) const override {
    CUDA_CHECK(cudaMemcpyAsync(nchw, src, size_t(s.numel()) * sizeof(float),
                               cudaMemcpyDeviceToHost, ctx_.stream()));
  }
  void accumulate(float* y, const float* x, size_t n) const override {
    reduce_add(Elem::f32, y, x, n, ctx_.stream());
  }
  std::unique_ptr<ConvOp<float>> make_conv(const ConvDesc& d) override {
    return std::make_unique<CudnnConv>(d, ctx_);
  }
  std::unique_ptr<BatchNormOp<float>> make_batchnorm(const BatchNormDesc& d) override {
    if (d.sync) return make_sync_batchnorm(d, ctx_);  // model.bn_group: ours, cuDNN's has no place for it
    return std::make_unique<CudnnBatchNorm>(d, ctx_, scratch_);
  }
  std::unique_ptr<ReluOp<float>> make_relu(const ReluDesc& d) override {
    return make_device_relu(d, ctx_);
  }
  std::unique_ptr<MaxPoolOp<float>> make_maxpool(const MaxPoolDesc& d) override {
    return make_device_maxpool(d, ctx_);
  }
  std::unique_ptr<GlobalAvgPoolOp<float>> make_global_avgpool(const GlobalAvgPoolDesc& d) override {
    return make_device_global_avgpool(d, ctx_);
  }
  std::unique_ptr<AvgPoolOp<float>> make_avgpool(const AvgPoolDesc& d) override {
    return make_device_avgpool(d, ctx_);
  }
  std::unique_ptr<LinearOp<float>> make_linear(const LinearDesc& d) override {
    return std::make_unique<CublasLinear>(d, ctx_);
  }
  std::unique_ptr<AddOp<float>> make_add(const AddDesc& d) override {
    return make_device_add(d, ctx_);
  }
  std::unique_ptr<PadShortcutOp<float>> make_pad_shortcut(const PadShortcutDesc& d) override {
    return make_device_pad_shortcut(d, ctx_);
  }
  std::unique_ptr<SoftmaxXentOp<float>> make_softmax_xent(const SoftmaxXentDesc& d) override {
    return std::make_unique<DeviceSoftmaxXent>(d, ctx_.stream());
  }
  std::unique_ptr<DropPathOp<float>> make_drop_path(const DropPathDesc& d) override {
    return make_device_drop_path<float>(d, d.in.chw(), ctx_);
  }
  std::unique_ptr<ChannelGateOp<float>> make_channel_gate(const ChannelGateDesc& d) override {
    return make_device_channel_gate(d, ctx_);
  }
  std::unique_ptr<ChannelConvOp<float>> make_channel_conv(const ChannelConvDesc& d) override {
    return make_device_channel_conv(d, ctx_);
  }
};

// "cuda": fp32 with cuDNN's heuristic algorithm choice, comparable with the CPU backends.
// "cuda-tf32": TF32 tensor cores and algorithms timed once per shape (PyTorch's
// allow_tf32 + cudnn.benchmark): the fast configuration.
std::unique_ptr<Backend<float>> make_default(const BackendOptions& o) {
  return make_cuda_backend(context_config(o, "cuda", false, local_rank_device(o)));
}
std::unique_ptr<Backend<float>> make_tf32(const BackendOptions& o) {
  ContextConfig cfg = context_config(o, "cuda-tf32", true, local_rank_device(o));
  cfg.allow_tf32 = true;
  return make_cuda_backend(cfg);
}

// The first of the launchers' variables that is set, as an int (fallback when none is).
int launcher_int(std::initializer_list<const char*> vars, int fallback) {
  for (const char* var : vars)
    if (const char* v = std::getenv(var); v && *v) return std::atoi(v);
  return fallback;
}

}  // namespace

std::string shared_device_note(int local_size, int devices, const char* visible) {
  if (devices <= 0 || local_size <= devices) return "";
  if (visible && *visible)
    return str_cat("ringtrain: note: ", local_size, " ranks on this node, and CUDA_VISIBLE_DEVICES=",
                   visible, " shows this one ", devices, devices == 1 ? " GPU" : " GPUs",
                   " (local rank k takes GPU k mod ", devices, "): unless each rank was given "
                   "GPUs of its own there, they share them; launch one rank per GPU for full speed");
  return str_cat("ringtrain: note: ", local_size, " ranks on this node share its ", devices,
                 devices == 1 ? " GPU" : " GPUs", " (local rank k takes GPU k mod ", devices,
                 "): each gets a fraction of one; launch one rank per GPU for full speed");
}

int node_local_rank(const BackendOptions& o) {
  if (o.local_rank >= 0) return o.local_rank;
  return std::max(launcher_int({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}, 0), 0);
}
int node_local_size(const BackendOptions& o) {
  if (o.local_size > 0) return o.local_size;
  return std::max(launcher_int({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}, 1), 1);
}

int local_rank_device(const BackendOptions& o, bool note) {
  // Rank k of a node takes GPU k (modulo the GPUs it sees), as Horovod and torchrun place ranks.
  const int local = node_local_rank(o), n = device_count();
  static std::once_flag noted;
  if (note && local == 0)
    std::call_once(noted, [n, size = node_local_size(o)] {
      const std::string note = shared_device_note(size, n, std::getenv("CUDA_VISIBLE_DEVICES"));
      if (!note.empty()) std::fprintf(stderr, "%s\n", note.c_str());
    });
  return n > 0 ? local % n : 0;
}

void select_launcher_device() {
  // A failure (which the backend will report in its own words) must not stay the last error.
  // No note about shared GPUs here: the run may not use one (backend: onednn); making a cuda
  // backend gives it.
  if (device_count() > 0 && cudaSetDevice(local_rank_device(BackendOptions{}, false)) != cudaSuccess)
    (void)cudaGetLastError();
}

std::unique_ptr<Backend<float>> make_cuda_backend(const ContextConfig& cfg) {
  std::string why;
  if (device_count(&why) == 0) throw Error("backend 'cuda': no usable CUDA device: " + why);
  return std::make_unique<CudaBackend>(cfg);
}

void register_backend() {
  rt::register_backend("cuda", &make_default);
  rt::register_backend("cuda-tf32", &make_tf32);
  register_lowp_backends();  // "cuda-bf16", "cuda-fp16" (cuda/lowp_backend.h)
}

}  // namespace rt::cuda
