// CudaContext: handles bound to one stream, math modes, the shared workspace.
#include "cuda/context.h"

#include "cuda/check.h"

namespace rt::cuda {

CudaContext::CudaContext(ContextConfig cfg) : cfg_(cfg) {
  try {
    CUDA_CHECK(cudaSetDevice(cfg_.device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDNN_CHECK(cudnnCreate(&cudnn_));
    CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    // cuBLAS's default math keeps fp32 GEMMs in fp32; TF32 only when asked for.
    CUBLAS_CHECK(cublasSetMathMode(cublas_, cfg_.allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                            : CUBLAS_DEFAULT_MATH));
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
