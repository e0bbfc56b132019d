// Checks for every CUDA runtime, cuDNN, cuBLAS and NCCL return value and every kernel launch: a
// failure throws rt::Error with file:line, the call as written and the library's own error string
// (rt::OutOfMemory where the library says an allocation failed).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>

#include "nn/error.h"

namespace rt::cuda {

// Out of line so that each check site stays one compare and one branch.
[[noreturn]] void throw_cuda_error(const char* file, int line, const char* call, cudaError_t e);
[[noreturn]] void throw_cudnn_error(const char* file, int line, const char* call, cudnnStatus_t s);
[[noreturn]] void throw_cublas_error(const char* file, int line, const char* call,
                                     cublasStatus_t s);

// cuDNN and cuBLAS take int dimensions, and a legacy cuDNN tensor descriptor holds at most
// 2^31 - 1 elements; past either they answer with a bare status, so these name the layer (any
// layer description with a name and an input shape).
template <class Desc>
int lib_int(int64_t v, const Desc& d, const char* lib = "cuDNN", int64_t least = 0) {
  RT_SHAPE_CHECK(v >= least && v <= INT32_MAX, "layer ", d.name, ": dimension ", v, " does not fit ",
                 lib, "'s int (input ", d.in.str(), ")");
  return int(v);
}
template <class Desc, class S>
void check_cudnn_numel(const S& s, const Desc& d) {
  RT_SHAPE_CHECK(s.numel() <= INT32_MAX, "layer ", d.name, ": tensor ", s.str(), " has ", s.numel(),
                 " elements, more than cuDNN's 2^31 - 1 per tensor: a smaller batch");
}

}  // namespace rt::cuda

#define CUDA_CHECK(expr)                                                                   \
  do {                                                                                     \
    const cudaError_t rt_err_ = (expr);                                                    \
    if (rt_err_ != cudaSuccess) ::rt::cuda::throw_cuda_error(__FILE__, __LINE__, #expr, rt_err_); \
  } while (0)

#define CUDNN_CHECK(expr)                                                                   \
  do {                                                                                      \
    const cudnnStatus_t rt_st_ = (expr);                                                    \
    if (rt_st_ != CUDNN_STATUS_SUCCESS)                                                     \
      ::rt::cuda::throw_cudnn_error(__FILE__, __LINE__, #expr, rt_st_);                     \
  } while (0)

#define CUBLAS_CHECK(expr)                                                                  \
  do {                                                                                      \
    const cublasStatus_t rt_st_ = (expr);                                                   \
    if (rt_st_ != CUBLAS_STATUS_SUCCESS)                                                    \
      ::rt::cuda::throw_cublas_error(__FILE__, __LINE__, #expr, rt_st_);                    \
  } while (0)

// After a kernel launch: configuration errors (too many threads, too much shared memory) surface
// here, at the launch that caused them, rather than at some later unrelated call.
#define CUDA_CHECK_LAUNCH()                                                                 \
  do {                                                                                      \
    const cudaError_t rt_err_ = cudaGetLastError();                                         \
    if (rt_err_ != cudaSuccess)                                                             \
      ::rt::cuda::throw_cuda_error(__FILE__, __LINE__, "kernel launch", rt_err_);           \
  } while (0)

// NCCL_CHECK exists only in code built with NCCL (RT_HAVE_NCCL: rt_nccl and what links it), so
// that the rest of cuda/ neither needs nccl.h nor loads libnccl. throw_nccl_error is defined in
// cuda/nccl_allreducer.cc, the one place that links NCCL.
#ifdef RT_HAVE_NCCL
#include <nccl.h>

namespace rt::cuda {
// Adds ncclGetLastError's detail (which peer, which transport) to the result's generic string.
[[noreturn]] void throw_nccl_error(const char* file, int line, const char* call, ncclResult_t r);
}  // namespace rt::cuda

#define NCCL_CHECK(expr)                                                                    \
  do {                                                                                      \
    const ncclResult_t rt_nr_ = (expr);                                                     \
    if (rt_nr_ != ncclSuccess) ::rt::cuda::throw_nccl_error(__FILE__, __LINE__, #expr, rt_nr_); \
  } while (0)
#endif
