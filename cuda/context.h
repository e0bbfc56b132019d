// What every cuDNN/cuBLAS op of one model shares: a stream, the library handles bound to it, and
// one workspace sized at set-up to the largest any op asked for.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <string>

#include "cuda/conv_algo_cache.h"
#include "cuda/memory.h"
#include "nn/ops.h"

namespace rt::cuda {

struct ContextConfig {
  int device = 0;
  // TF32 tensor cores for fp32 convolutions and GEMMs: about 2x faster on H100/H200, with a
  // 10-bit mantissa in the products. Off by default so results compare with the CPU backends.
  bool allow_tf32 = false;
  // Convolution algorithms: false takes cuDNN's heuristic ranking (no device time); true times
  // the candidates once per shape (cudnnFind*), which allocates and runs them at set-up.
  bool benchmark_algos = false;
  bool deterministic = false;               // only algorithms with reproducible results
  size_t workspace_limit = size_t{1} << 30; // per op; candidates needing more are skipped
  // A file that keeps convolution algorithm choices across runs (conv_algo_file.h); "" for none.
  std::string algo_cache;
};

// What a convolution algorithm choice depends on besides its shape, for the algorithm cache
// file: the device's model and compute capability, the cuDNN and CUDA runtime versions, and
// cfg's settings that sway the choice.
std::string context_identity(const ContextConfig& cfg);

// The configuration a registered backend (`backend`, for errors) runs on `device` with for a job's
// options; `timed` is the backend's own choice for conv_algos "auto". Throws rt::Error for an
// unknown conv_algos, a negative workspace, or deterministic with timed choice (timing may choose
// other algorithms next run).
ContextConfig context_config(const BackendOptions& o, const std::string& backend, bool timed, int device);

// A warning when the cuDNN loaded (version `cudnn`, from `file`) was built for another CUDA
// major version (`cudnn_cudart`, as cudnnGetCudartVersion: 12080 is 12.8) than the runtime this
// program runs (`runtime`, as cudaRuntimeGetVersion); "" when they agree. Such a cuDNN (a Python
// wheel for another CUDA, say) fails later in ways that name neither: engines that do not load,
// every convolution refused. CudaContext prints it once per process.
std::string cudnn_cuda_mismatch(size_t cudnn, size_t cudnn_cudart, int runtime, const std::string& file);

class CudaContext {
 public:
  // Selects the device, creates a non-blocking stream and the cuDNN and cuBLAS handles on it, and
  // reads cfg.algo_cache when set (rt::Error naming the file when it cannot be used).
  explicit CudaContext(ContextConfig cfg = {});
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  cudaStream_t stream() const { return stream_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  cublasHandle_t cublas() const { return cublas_; }
  const ContextConfig& config() const { return cfg_; }

  // Set-up only: grows the shared workspace to at least `bytes` (reallocating, so pointers from
  // workspace() taken earlier are stale; ops fetch it when they execute).
  void reserve_workspace(size_t bytes);
  void* workspace() const { return workspace_.get(); }
  size_t workspace_bytes() const { return workspace_.bytes(); }
  // The convolution algorithms chosen so far, by shape (conv_choose_algos).
  ConvAlgoCache& conv_algos() { return conv_algos_; }
  const ConvAlgoCache& conv_algos() const { return conv_algos_; }

 private:
  void release() noexcept;
  ContextConfig cfg_;
  cudaStream_t stream_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer workspace_;
  ConvAlgoCache conv_algos_;
};

}  // namespace rt::cuda
