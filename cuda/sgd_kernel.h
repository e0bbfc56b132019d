// The fused optimizer step (SGD, AdamW, LAMB) over the flat parameter arena on the device
// (C++17-clean: nvcc includes it).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/lars.h"
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
  // LARS (num_lars > 0): the tensors it scales, scratch for 2 sums per segment, and each
  // segment's factor s (1 for segments of tensors LARS leaves alone, set once by the caller).
  const LarsTensor* lars = nullptr;  // device array
  uint32_t num_lars = 0;
  double* lars_sums = nullptr;       // 2 per segment
  float* segment_scale = nullptr;    // 1 per segment
  double lars_trust = 0, lars_eps = 0;
  // AdamW (adam 1) and LAMB (adam 2), nn/adam.h's update: `momentum` is the first moment,
  // `second` the second; LAMB's trust ratios go through lars, lars_sums and segment_scale as
  // LARS's do. The scalars are AdamScalars<float>'s.
  uint8_t adam = 0;
  float* second = nullptr;
  float w1 = 0, b2 = 0, w2 = 0, eps = 0;
  // The bias corrections of each group of tensors (a segment's `group`), from its own count t.
  struct Bias {
    float bc1 = 0, bc2_root = 0;  // 1 − β1^t, √(1 − β2^t)
    double bc1_d = 0;             // 1 − β1^t unrounded (AdamW's step size lr_t / bc1_d)
  } bias[kAdamGroups];
  // lr unrounded: each segment's rate is lr_d · its lr_mult, rounded once (lr is the plain one).
  double lr_d = 0;
};

// One update, asynchronously on stream; see Sgd<T> in nn/optimizer.h and Adam<T> in nn/adam.h
// for the arithmetic. With LARS, two small kernels first compute the trust ratios (cuda/lars.h);
// LAMB runs three: moments and norms, ratios, the update.
void sgd_step_launch(const SgdStepArgs& a, cudaStream_t stream);

}  // namespace rt::cuda
