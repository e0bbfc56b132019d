// The element arithmetic a collective needs, supplied by the backend that owns the memory: the
// CPU one here; a GPU backend supplies kernels on device memory (bf16/f16 accumulate in fp32).
#pragma once
#include <cstddef>

#include "nn/tensor.h"

namespace rt::comm {

class ReduceKernels {
 public:
  virtual ~ReduceKernels() = default;
  // dst[i] += src[i] for i < n. 16-bit types add in fp32 and round once to nearest-even.
  virtual void reduce_add(DType t, void* dst, const void* src, size_t n) const = 0;
  // buf[i] *= s for i < n (averaging: the sum scaled once by 1/ranks).
  virtual void scale(DType t, void* buf, size_t n, float s) const = 0;
  // dst[i] = (src[i] · s) in type `to`: the product in fp32, rounded once to nearest-even (fp16:
  // inf from 65520 up, as the GPU's conversion). Gradient compression: f32 → bf16/f16 before a
  // bucket's allreduce, back after. dst and src do not overlap.
  virtual void convert(DType to, void* dst, DType from, const void* src, size_t n, float s) const = 0;
  // True if t is supported (the CPU kernels support all three).
  virtual bool supports(DType t) const = 0;
};

// The CPU kernels (AVX2 for f32 when the processor has it). A process-wide immutable instance.
const ReduceKernels& cpu_reduce_kernels();

// Plain-loop f32 kernels, exposed for tests of the vectorised ones.
void reduce_add_f32_scalar(float* dst, const float* src, size_t n);

}  // namespace rt::comm
