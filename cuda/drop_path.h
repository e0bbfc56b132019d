// Stochastic depth on the device (rt::DropPathOp) for the fp32 and 16-bit backends: the per-sample
// factors go up through a page-locked mirror with the forward, and backward reuses them.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "cuda/drop_path_kernel.h"
#include "nn/ops.h"

namespace rt::cuda {

class CudaContext;

// T: float for the fp32 backends, bf16 or f16 for the 16-bit ones (their activations are passed
// as float pointers, as every op of theirs). per_sample: act_size(in) / in.n.
template <class T>
std::unique_ptr<DropPathOp<float>> make_device_drop_path(const DropPathDesc& d, int64_t per_sample,
                                                         CudaContext& ctx);

}  // namespace rt::cuda
