// Device and pinned host allocation, counted: set-up allocates, the step must not, and tests read
// the counters to prove it. Everything here runs on the host (C++17-clean).
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>

#include "nn/host_memory.h"

namespace rt::cuda {

struct AllocStats {
  int64_t device_allocs = 0;  // cudaMalloc calls made through device_malloc
  int64_t device_frees = 0;
  int64_t pinned_allocs = 0;  // cudaMallocHost calls made through pinned_malloc
  int64_t pinned_frees = 0;
  int64_t device_bytes = 0;   // live bytes
  int64_t pinned_bytes = 0;
};
// Process-wide counters (thread-safe).
AllocStats alloc_stats();

// cudaMalloc / cudaFree and cudaMallocHost / cudaFreeHost with counting; throw rt::Error on
// failure naming the size. Zero bytes gives nullptr and counts nothing.
void* device_malloc(size_t bytes);
void device_free(void* p, size_t bytes);
void* pinned_malloc(size_t bytes);
void pinned_free(void* p, size_t bytes);

// Whether host memory at p is page-locked (pinned_malloc's, or registered). CUDA copies pageable
// memory before cudaMemcpyAsync returns, so the caller may reuse it at once; page-locked memory
// is read when the copy runs, so the caller must wait for it first.
bool is_page_locked(const void* p);

// Makes `device` the calling thread's current one (the current device is per thread, and a
// thread that never chose one gets device 0, and a context there, at its first CUDA call).
void bind_device(int device);

// Waits for the legacy default stream: cudaMemcpy from pageable memory returns once the bytes are
// staged, before their DMA to the device ends, and cudaMemset returns at once, both still queued
// there, where the backends' non-blocking streams do not wait for them.
void finish_legacy_stream();

// pinned_malloc / pinned_free as a HostMemory for the backends on `device` (their
// input_memory()), callable from any thread; process-wide, so batches allocated there may
// outlive any backend.
HostMemory& pinned_memory(int device);

// Owning device allocation, move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : p_(device_malloc(bytes)), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void* get() const { return p_; }
  template <class T> T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }
  // Copies for set-up and tests (offset and size in bytes, checked against bytes()), done when
  // they return, so that work on any stream may use the buffer next. They run on the legacy
  // default stream, which the backends' non-blocking streams do not wait for: download() reads
  // what work queued elsewhere has not finished writing unless that stream was synchronized.
  void upload(const void* host, size_t n, size_t offset = 0);
  void download(void* host, size_t n, size_t offset = 0) const;
  void zero();

 private:
  void reset();
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace rt::cuda
