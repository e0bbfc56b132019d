// The CUDA backends' rt::MemorySpace implementations: device memory for activations (ordered
// with the backend's stream) and managed memory for the arena (host code reads it after a sync).
#pragma once
#include <cuda_runtime.h>

#include <cstring>
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
  bool host_accessible() const override { return false; }

 private:
  cudaStream_t stream_;
};

class ManagedMemorySpace final : public MemorySpace {
 public:
  explicit ManagedMemorySpace(cudaStream_t stream) : stream_(stream) {}
  std::string name() const override { return "CUDA managed memory"; }
  void* allocate(size_t bytes) const override {
    void* p = nullptr;
    if (bytes == 0) return p;
    CUDA_CHECK(cudaMallocManaged(&p, bytes));
    std::memset(p, 0, bytes);
    return p;
  }
  void deallocate(void* p, size_t) const noexcept override {
    cudaStreamSynchronize(stream_);
    cudaFree(p);
  }
  void copy(void* dst, const void* src, size_t bytes) const override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(dst, src, bytes);
  }
  void zero(void* p, size_t bytes) const override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memset(p, 0, bytes);
  }
  bool host_accessible() const override { return true; }

 private:
  cudaStream_t stream_;
};

}  // namespace rt::cuda
