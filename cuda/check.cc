// The error messages of cuda/check.h: where, what was called, and the library's own words.
#include "cuda/check.h"

namespace rt::cuda {

void throw_cuda_error(const char* file, int line, const char* call, cudaError_t e) {
  throw Error(str_cat(file, ":", line, ": ", call, ": ", cudaGetErrorName(e), ": ",
                      cudaGetErrorString(e)));
}

void throw_cudnn_error(const char* file, int line, const char* call, cudnnStatus_t s) {
  throw Error(str_cat(file, ":", line, ": ", call, ": cuDNN: ", cudnnGetErrorString(s), " (",
                      int(s), ")"));
}

void throw_cublas_error(const char* file, int line, const char* call, cublasStatus_t s) {
  throw Error(str_cat(file, ":", line, ": ", call, ": ", cublasGetStatusName(s), ": ",
                      cublasGetStatusString(s)));
}

}  // namespace rt::cuda
