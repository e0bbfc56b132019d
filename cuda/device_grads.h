// comm::DeviceGrads for CUDA: fences are events on the compute stream; the staged path copies
// buckets through a pinned mirror on two copy streams of its own; the direct path reduces with
// device kernels on a stream of its own, into device scratch.
#pragma once
#include <cuda_runtime.h>

#include <memory>

#include "comm/device_grads.h"

namespace rt::cuda {

// Hooks for a gradient buffer written by the work queued on `compute` (the backend's stream),
// for comm::GradientReducer's device constructor, which sets them up with the buffer:
//
//   auto hooks = make_device_grads(ctx.stream(), comm::comm_device_path(cfg.comm));
//   comm::GradientReducer gr(comm, cfg.comm, std::move(hooks), grads, count, DType::f32, fp);
//
// Set-up allocates (counted, cuda/memory.h): direct, one device scratch segment per receive in
// flight; staged, a pinned mirror as large as the buffer. Events and streams are created there too;
// steps allocate nothing. The compute stream must outlive the hooks.
std::unique_ptr<comm::DeviceGrads> make_device_grads(cudaStream_t compute, comm::DevicePath path);

}  // namespace rt::cuda
