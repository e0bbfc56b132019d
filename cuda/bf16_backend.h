// The mixed-precision CUDA rt::Backend<float> "cuda-bf16": activations and their gradients are
// bf16 in NHWC on the device (two per float of Backend::act_size); parameters, their gradients,
// BN running statistics and the optimizer state stay fp32 in the device arena, in canonical
// layouts, so the optimizer, the allreduce and checkpoints are those of "cuda".
#pragma once
#include <memory>

#include "cuda/context.h"
#include "nn/ops.h"

namespace rt::cuda {

// Throws rt::Error naming the backend, with the runtime's reason, when no device is usable.
std::unique_ptr<Backend<float>> make_cuda_bf16_backend(const ContextConfig& cfg = {});

// Makes rt::make_backend<float>("cuda-bf16") build make_cuda_bf16_backend() on the process's
// local_rank_device(), with convolution algorithms timed once per shape. Called by
// rt::cuda::register_backend().
void register_bf16_backend();

}  // namespace rt::cuda
