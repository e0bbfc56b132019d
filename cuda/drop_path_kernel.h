// Launcher of stochastic depth's kernel (C++17-clean: nvcc includes it).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace rt::cuda {

// y = s[n] x over samples x per_sample elements of T (float, or the 16-bit storage types, in fp32
// arithmetic with one rounding); device pointers, asynchronous on `stream`. y may be x.
template <class T>
void drop_path_launch(const T* x, const float* scales, T* y, int64_t samples, int64_t per_sample,
                      cudaStream_t stream);

}  // namespace rt::cuda
