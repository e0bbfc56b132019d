// The unit of work of the device SGD step, in plain C++ (no CUDA headers) for the host tests.
#pragma once
#include <cstdint>

namespace rt::cuda {

// A contiguous piece of one parameter tensor with that tensor's weight decay and learning-rate
// factor: one thread block's
// work. Padding between tensors belongs to no segment and is never touched.
struct SgdSegment {
  uint64_t begin = 0;  // element offset into params / grads / momentum
  uint32_t count = 0;  // elements (1 .. kSgdSegmentElems)
  float weight_decay = 0;
  double lr_mult = 1;  // the tensor's learning-rate factor (optimizer.lr_mult)
  uint32_t group = 0;  // AdamW, LAMB: the tensor's group of update counts (nn/adam.h AdamStepCounts)
};
// Groups of update counts the step takes scalars for (nn/adam.h kAdamMaxGroups).
constexpr uint32_t kAdamGroups = 8;
// Elements per segment: a few per thread of a 256-thread block, so blocks are cheap to schedule
// and a parameter tensor of any size becomes whole blocks.
constexpr uint32_t kSgdSegmentElems = 4096;

}  // namespace rt::cuda
