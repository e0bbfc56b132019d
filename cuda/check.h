// Error checks for CUDA runtime calls and kernel launches: file:line and CUDA's own message.
#pragma once
#include <cuda_runtime.h>

#include "nn/error.h"

#define CUDA_CHECK(expr)                                                                    \
  do {                                                                                      \
    cudaError_t rt_err_ = (expr);                                                           \
    if (rt_err_ != cudaSuccess)                                                             \
      throw ::rt::Error(::rt::str_cat(__FILE__, ":", __LINE__, ": ", #expr, ": ",           \
                                      cudaGetErrorString(rt_err_)));                        \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next call.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
