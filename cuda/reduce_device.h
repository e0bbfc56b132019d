// comm::ReduceKernels on device memory, so the ring allreduce can reduce GPU-resident buffers
// (with a CUDA-aware MPI, or on the staging path's device side).
#pragma once
#include <cuda_runtime.h>

#include <memory>

#include "comm/reduce.h"
#include "cuda/kernels.h"

namespace rt::cuda {

// The cuda::Elem of an rt::DType (the same three types).
Elem elem_of(DType t);

// Kernels launched on `stream`, which belongs to the device current when they are made (each call
// binds that device on its own thread first). Each call synchronizes the stream before returning: the ring
// hands dst to MPI right after reduce_add, and MPI does not order itself after our stream.
std::unique_ptr<comm::ReduceKernels> make_device_reduce_kernels(cudaStream_t stream);

}  // namespace rt::cuda
