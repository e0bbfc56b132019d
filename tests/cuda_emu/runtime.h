// The emulator's CUDA runtime: the calls the backend's kernel launchers and buffers make, on host
// memory (tests/cuda_emu/runtime.cc). Device memory is ordinary heap memory that kernels and the
// host alike may touch; streams queue work until something waits for it (streams.h).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace rt_emu {

// What cudaGetLastError returns (and clears) next: a refused launch sets it.
void set_last_error(cudaError_t e);
// A device fault (cudaErrorIllegalAddress, say), sticky as on a GPU: cudaGetLastError,
// cudaPeekAtLastError and the synchronize and query calls return it until it is set back to
// cudaSuccess (which a real process cannot do; tests end their fault that way).
void set_device_fault(cudaError_t e);
cudaError_t device_fault();
// cudaMalloc calls so far on this process and bytes still allocated by them.
int64_t device_allocations();
int64_t device_bytes_live();
// The byte cudaMalloc fills new memory with: 0xff reads as NaN in every float type, so a kernel
// reading memory nobody wrote shows it.
constexpr unsigned char kPoison = 0xff;

}  // namespace rt_emu
