// The CUDA backends' rt::MemorySpace: plain device memory (cudaMalloc, through the counted
// allocator), ordered with the backend's stream, for activations and the parameter arena alike;
// host code reads and writes it only through to_host / from_host.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "cuda/check.h"
#include "cuda/memory.h"
#include "nn/tensor.h"

namespace rt::cuda {

class DeviceMemorySpace final : public MemorySpace {
 public:
  explicit DeviceMemorySpace(cudaStream_t stream) : stream_(stream) {}
  std::string name() const override { return "CUDA device memory"; }
  void* allocate(size_t bytes) const override {
    void* p = device_malloc(bytes);
    zero(p, bytes);
    return p;
  }
  void deallocate(void* p, size_t bytes) const noexcept override {
    cudaStreamSynchronize(stream_);  // work still queued may use it
    try {
      device_free(p, bytes);
    } catch (...) {  // a destructor path: nothing to do but not leak the exception
    }
  }
  void copy(void* dst, const void* src, size_t bytes) const override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void zero(void* p, size_t bytes) const override {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  }
  // On the stream, after the work queued there; waits, so the host buffer is free on return.
  void to_host(void* host_dst, const void* src, size_t bytes) const override {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void from_host(void* dst, const void* host_src, size_t bytes) const override {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  bool host_accessible() const override { return false; }

 private:
  cudaStream_t stream_;
};

}  // namespace rt::cuda
