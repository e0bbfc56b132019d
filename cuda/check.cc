// The error messages of cuda/check.h: where, what was called, and the library's own words.
#include "cuda/check.h"

#include <string>
#include <utility>

namespace rt::cuda {

namespace {
// An allocation failure inside a library call is rt::OutOfMemory, as one of ours, so that the
// trainer can say which setting to lower.
[[noreturn]] void throw_as(bool out_of_memory, std::string what) {
  if (out_of_memory) throw OutOfMemory(std::move(what));
  throw Error(std::move(what));
}
}  // namespace

void throw_cuda_error(const char* file, int line, const char* call, cudaError_t e) {
  throw_as(e == cudaErrorMemoryAllocation, str_cat(file, ":", line, ": ", call, ": ",
                                                   cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

void throw_cudnn_error(const char* file, int line, const char* call, cudnnStatus_t s) {
  // cuDNN 9 keeps, per thread, why its last failed call failed (this one): "BAD_PARAM" alone does
  // not say which parameter, nor "NOT_SUPPORTED" what.
  char why[512] = {};
  cudnnGetLastErrorString(why, sizeof why);
  throw_as(s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED ||
               s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED,
           str_cat(file, ":", line, ": ", call, ": cuDNN: ", cudnnGetErrorString(s), " (", int(s),
                   ")", *why ? ": " : "", why));
}

void throw_cublas_error(const char* file, int line, const char* call, cublasStatus_t s) {
  throw_as(s == CUBLAS_STATUS_ALLOC_FAILED, str_cat(file, ":", line, ": ", call, ": ",
                                                    cublasGetStatusName(s), ": ", cublasGetStatusString(s)));
}

}  // namespace rt::cuda
