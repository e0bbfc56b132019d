// CudaBackend: memory spaces, activation import/export and the op factories.
//
// Where memory lives: activations and their gradients are device memory the host never reads
// (act_import / act_export copy them). The arena is managed memory: the step's passes over it
// (the gradient scale-and-check, the SGD update) run on the device, while checkpoints,
// consistency checks and fault diagnosis read it on the host after Backend::sync().
#include "cuda/backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cuda/check.h"
#include "cuda/cublas_linear.h"
#include "cuda/cudnn_batchnorm.h"
#include "cuda/cudnn_conv.h"
#include "cuda/device.h"
#include "cuda/kernels.h"
#include "cuda/layer_ops.h"
#include "cuda/sgd.h"
#include "cuda/softmax_xent.h"

namespace rt::cuda {
namespace {

// Device memory, ordered with the backend's stream (copies happen during backward).
class DeviceSpace final : public MemorySpace {
 public:
  explicit DeviceSpace(cudaStream_t stream) : stream_(stream) {}
  std::string name() const override { return "CUDA device memory"; }
  void* allocate(size_t bytes) const override {
    void* p = device_malloc(bytes);
    zero(p, bytes);
    return p;
  }
  void deallocate(void* p, size_t bytes) const noexcept override {
    cudaStreamSynchronize(stream_);  // work still queued may use it
    try {
      device_free(p, bytes);
    } catch (...) {  // a destructor path: nothing to do but not leak the exception
    }
  }
  void copy(void* dst, const void* src, size_t bytes) const override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void zero(void* p, size_t bytes) const override {
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  }
  bool host_accessible() const override { return false; }

 private:
  cudaStream_t stream_;
};

// Managed memory for the arena: host code reads and writes it after Backend::sync().
class ManagedSpace final : public MemorySpace {
 public:
  explicit ManagedSpace(cudaStream_t stream) : stream_(stream) {}
  std::string name() const override { return "CUDA managed memory"; }
  void* allocate(size_t bytes) const override {
    void* p = nullptr;
    if (bytes == 0) return p;
    CUDA_CHECK(cudaMallocManaged(&p, bytes));
    std::memset(p, 0, bytes);
    return p;
  }
  void deallocate(void* p, size_t) const noexcept override {
    cudaStreamSynchronize(stream_);
    cudaFree(p);
  }
  void copy(void* dst, const void* src, size_t bytes) const override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(dst, src, bytes);
  }
  void zero(void* p, size_t bytes) const override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memset(p, 0, bytes);
  }
  bool host_accessible() const override { return true; }

 private:
  cudaStream_t stream_;
};

// The Net hands host labels to the loss; the kernels read them from a device copy made in
// forward and reused by backward.
class LabelUploadXent final : public SoftmaxXentOp<float> {
 public:
  LabelUploadXent(const SoftmaxXentDesc& d, cudaStream_t stream)
      : inner_(d, stream), stream_(stream), n_(size_t(d.in.n)),
        labels_(size_t(d.in.n) * sizeof(int32_t)) {}
  double forward(const float* logits, const int32_t* labels) override {
    CUDA_CHECK(cudaMemcpyAsync(labels_.get(), labels, n_ * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream_));
    return inner_.forward(logits, labels_.as<int32_t>());  // waits for the stream
  }
  void backward(const int32_t*, float* dlogits, double scale) override {
    inner_.backward(labels_.as<int32_t>(), dlogits, scale);
  }

 private:
  DeviceSoftmaxXent inner_;
  cudaStream_t stream_;
  size_t n_;
  DeviceBuffer labels_;
};

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

class CudaBackend final : public Backend<float> {
 public:
  explicit CudaBackend(const ContextConfig& cfg)
      : ctx_(cfg), device_(ctx_.stream()), managed_(ctx_.stream()) {}
  ~CudaBackend() override { cudaStreamSynchronize(ctx_.stream()); }

  std::string name() const override { return "cuda"; }
  size_t act_size(const Shape& s) const override { return size_t(s.numel()); }
  // Both wait for the stream: the caller reuses or reads its host buffer right after.
  void act_import(const float* nchw, const Shape& s, float* dst) const override {
    CUDA_CHECK(cudaMemcpyAsync(dst, nchw, size_t(s.numel()) * sizeof(float),
                               cudaMemcpyHostToDevice, ctx_.stream()));
    CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
  }
  void act_export(const float* src, const Shape& s, float* nchw) const override {
    CUDA_CHECK(cudaMemcpyAsync(nchw, src, size_t(s.numel()) * sizeof(float),
                               cudaMemcpyDeviceToHost, ctx_.stream()));
    CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
  }
  void accumulate(float* y, const float* x, size_t n) const override {
    reduce_add(Elem::f32, y, x, n, ctx_.stream());
  }
  const MemorySpace* act_memory() const override { return &device_; }
  const MemorySpace* param_memory() const override { return &managed_; }
  void sync() const override { CUDA_CHECK(cudaStreamSynchronize(ctx_.stream())); }

  // The fused device SGD; LARS (per-tensor norms) has no device version yet and runs on the host,
  // on the managed arena, after a sync.
  std::unique_ptr<Optimizer<float>> make_sgd(std::vector<ParamInfo> layout, SgdConfig cfg) override {
    if (cfg.lars) return std::make_unique<HostSgdAfterSync>(std::move(layout), cfg, ctx_.stream());
    return std::make_unique<DeviceSgdOptimizer>(layout, cfg, ctx_.stream());
  }
  // One kernel scales and flags; only a flagged buffer is counted (on the host, a rare path).
  size_t scale_count_nonfinite(float* v, size_t n, float s, bool count) override {
    if (!count) {
      if (s != 1.0f) scale(Elem::f32, v, n, s, ctx_.stream());
      return 0;
    }
    CUDA_CHECK(cudaMemsetAsync(flag_.get(), 0, sizeof(int), ctx_.stream()));
    if (s != 1.0f) unscale_check(Elem::f32, v, n, s, flag_.as<int>(), ctx_.stream());
    else nonfinite_check(Elem::f32, v, n, flag_.as<int>(), ctx_.stream());
    int flagged = 0;
    CUDA_CHECK(cudaMemcpyAsync(&flagged, flag_.get(), sizeof(int), cudaMemcpyDeviceToHost, ctx_.stream()));
    CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
    return flagged ? Backend<float>::scale_count_nonfinite(v, n, 1.0f, true) : 0;
  }

  std::unique_ptr<ConvOp<float>> make_conv(const ConvDesc& d) override {
    return std::make_unique<CudnnConv>(d, ctx_);
  }
  std::unique_ptr<BatchNormOp<float>> make_batchnorm(const BatchNormDesc& d) override {
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
    return std::make_unique<LabelUploadXent>(d, ctx_.stream());
  }

 private:
  // Ops keep references to these: a Net destroys its ops and buffers before its backend.
  CudaContext ctx_;
  SharedScratch scratch_;
  DeviceSpace device_;
  ManagedSpace managed_;
  DeviceBuffer flag_{sizeof(int)};  // scale_count_nonfinite's "saw inf or NaN"
};

// "cuda": fp32 with cuDNN's heuristic algorithm choice, comparable with the CPU backends.
// "cuda-tf32": TF32 tensor cores and algorithms timed once per shape (PyTorch's
// allow_tf32 + cudnn.benchmark): the fast configuration.
std::unique_ptr<Backend<float>> make_default() {
  ContextConfig cfg;
  cfg.device = local_rank_device();
  return make_cuda_backend(cfg);
}
std::unique_ptr<Backend<float>> make_tf32() {
  ContextConfig cfg;
  cfg.device = local_rank_device();
  cfg.allow_tf32 = true;
  cfg.benchmark_algos = true;
  return make_cuda_backend(cfg);
}

}  // namespace

int local_rank_device() {
  // The launchers' node-local rank (Open MPI, MPICH/Hydra, Slurm): rank k of a node takes GPU k
  // (modulo the GPUs it sees), as Horovod and torchrun place ranks.
  int local = 0;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(var); v && *v) {
      local = std::atoi(v);
      break;
    }
  const int n = device_count();
  return n > 0 ? std::max(local, 0) % n : 0;
}

std::unique_ptr<Backend<float>> make_cuda_backend(const ContextConfig& cfg) {
  std::string why;
  if (device_count(&why) == 0) throw Error("backend 'cuda': no usable CUDA device: " + why);
  return std::make_unique<CudaBackend>(cfg);
}

void register_backend() {
  rt::register_backend("cuda", &make_default);
  rt::register_backend("cuda-tf32", &make_tf32);
}

}  // namespace rt::cuda
