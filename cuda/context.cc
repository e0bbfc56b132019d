// CudaContext: handles bound to one stream, math modes, the shared workspace.
#include "cuda/context.h"

#include <dlfcn.h>

#include <cstdio>
#include <mutex>

#include "cuda/check.h"

namespace rt::cuda {

ContextConfig context_config(const BackendOptions& o, const std::string& backend, bool timed, int device) {
  if (!o.conv_algos_known())
    throw Error(str_cat("backend '", backend, "': conv_algos must be auto, timed or heuristic (got '",
                        o.conv_algos, "')"));
  if (o.workspace_mib < 0)
    throw Error(str_cat("backend '", backend, "': workspace_mib must be >= 0 (got ", o.workspace_mib, ")"));
  if (o.deterministic_but_timed())
    throw Error(str_cat("backend '", backend, "': deterministic results need heuristic (or auto) "
                        "algorithm choice: timing may choose other algorithms on the next run"));
  ContextConfig c;
  c.device = device;
  c.deterministic = o.deterministic;
  c.benchmark_algos = o.conv_algos == "timed" || (o.conv_algos == "auto" && timed && !o.deterministic);
  c.workspace_limit = size_t(o.workspace_mib) << 20;
  c.algo_cache = o.algo_cache;
  return c;
}

std::string cudnn_cuda_mismatch(size_t cudnn, size_t cudnn_cudart, int runtime, const std::string& file) {
  if (runtime <= 0 || cudnn_cudart / 1000 == size_t(runtime) / 1000) return "";
  auto cuda = [](size_t v) { return str_cat(v / 1000, ".", v % 1000 / 10); };
  return str_cat("warning: cuDNN ", cudnn / 10000, ".", cudnn % 10000 / 100, ".", cudnn % 100,
                 file.empty() ? "" : " (" + file + ")", " was built for CUDA ", cuda(cudnn_cudart),
                 ", and this program runs CUDA ", cuda(size_t(runtime)),
                 ": its engines may fail to load or refuse every convolution; put a cuDNN 9 for CUDA ",
                 runtime / 1000, " first on LD_LIBRARY_PATH");
}

namespace {

// Once per process: which cuDNN the loader found, and whether it matches the runtime.
void note_cudnn_build() {
  static std::once_flag once;
  std::call_once(once, [] {
    int runtime = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) return;
    Dl_info info{};
    const std::string file =
        dladdr(reinterpret_cast<void*>(&cudnnGetVersion), &info) && info.dli_fname ? info.dli_fname : "";
    const std::string w = cudnn_cuda_mismatch(cudnnGetVersion(), cudnnGetCudartVersion(), runtime, file);
    if (!w.empty()) std::fprintf(stderr, "%s\n", w.c_str());
  });
}

}  // namespace

std::string context_identity(const ContextConfig& cfg) {
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, cfg.device));
  int runtime = 0;
  CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  return str_cat(p.name, " sm_", p.major, p.minor, " cudnn ", cudnnGetVersion(), " cudart ", runtime,
                 cfg.benchmark_algos ? " timed" : " heuristic", cfg.deterministic ? " deterministic" : "",
                 cfg.allow_tf32 ? " tf32" : "", " workspace ", cfg.workspace_limit);
}

CudaContext::CudaContext(ContextConfig cfg) : cfg_(cfg) {
  note_cudnn_build();
  try {
    CUDA_CHECK(cudaSetDevice(cfg_.device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDNN_CHECK(cudnnCreate(&cudnn_));
    CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    // cuBLAS's default math keeps fp32 GEMMs in fp32; TF32 only when asked for. A GEMM with a
    // 16-bit output (the 16-bit backends' dx) would otherwise be free to add split-K partial
    // sums in 16 bits: every reduction in fp32, as the accumulator.
    const int math = (cfg_.allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                     CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    CUBLAS_CHECK(cublasSetMathMode(cublas_, cublasMath_t(math)));
    if (!cfg_.algo_cache.empty()) conv_algos_.use_file(cfg_.algo_cache, context_identity(cfg_));
  } catch (...) {
    release();
    throw;
  }
}

CudaContext::~CudaContext() { release(); }

void CudaContext::release() noexcept {
  if (stream_) cudaStreamSynchronize(stream_);
  workspace_ = DeviceBuffer();
  if (cublas_) cublasDestroy(cublas_);
  if (cudnn_) cudnnDestroy(cudnn_);
  if (stream_) cudaStreamDestroy(stream_);
  cublas_ = nullptr;
  cudnn_ = nullptr;
  stream_ = nullptr;
}

void CudaContext::reserve_workspace(size_t bytes) {
  if (bytes <= workspace_.bytes()) return;
  CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old workspace may still be in use
  workspace_ = DeviceBuffer();
  workspace_ = DeviceBuffer(bytes);
}

}  // namespace rt::cuda
