// The fused SGD step over the flat parameter arena on the device (C++17-clean: nvcc includes it).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sgd_segment.h"

namespace rt::cuda {

struct SgdStepArgs {
  float* params = nullptr;
  const float* grads = nullptr;
  float* momentum = nullptr;
  const SgdSegment* segments = nullptr;  // device array
  uint64_t num_segments = 0;
  float lr = 0, momentum_coef = 0;
  bool first = false;     // the first step initialises the momentum buffer with g
  bool nesterov = false;
};

// One update, asynchronously on stream; see Sgd<T> in nn/optimizer.h for the arithmetic.
void sgd_step_launch(const SgdStepArgs& a, cudaStream_t stream);

}  // namespace rt::cuda
