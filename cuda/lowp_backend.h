// The mixed-precision CUDA rt::Backend<float>s "cuda-bf16" and "cuda-fp16": activations and their
// gradients are 16-bit (bf16, or IEEE half) in NHWC on the device (two per float of
// Backend::act_size); parameters, their gradients, BN running statistics and the optimizer state
// stay fp32 in the device arena, in canonical layouts, so the optimizer, the allreduce and
// checkpoints are those of "cuda". One implementation, templated on the storage type.
#pragma once
#include <memory>

#include "cuda/context.h"
#include "nn/ops.h"
#include "nn/tensor.h"

namespace rt::cuda {

// t: DType::bf16 ("cuda-bf16") or DType::f16 ("cuda-fp16"); throws rt::Error for f32. Throws
// rt::Error naming the backend, with the runtime's reason, when no device is usable.
std::unique_ptr<Backend<float>> make_cuda_lowp_backend(DType t, const ContextConfig& cfg = {});

// Makes rt::make_backend<float>("cuda-bf16") and ("cuda-fp16") build make_cuda_lowp_backend() on
// the process's local_rank_device(options), with convolution algorithms timed once per shape. Called by
// rt::cuda::register_backend().
void register_lowp_backends();

}  // namespace rt::cuda
