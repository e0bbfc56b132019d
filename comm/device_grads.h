// How GradientReducer reaches a gradient buffer in accelerator memory, without depending on the
// accelerator: a fence (backward may report gradients before the device has produced them), and
// either device kernels with device scratch (an MPI that reads device memory) or a host mirror
// that each bucket is copied to, reduced in and copied back from (an MPI that cannot).
#pragma once
#include <cstddef>
#include <cstdint>

#include "comm/reduce.h"
#include "nn/tensor.h"

namespace rt::comm {

// direct: MPI and the reduce kernels work on the device buffer itself (CUDA-aware MPI).
// staged: each bucket is downloaded to the host mirror, averaged there by the CPU ring, uploaded.
enum class DevicePath : uint8_t { direct, staged };
constexpr const char* device_path_name(DevicePath p) {
  return p == DevicePath::direct ? "direct" : "staged";
}

// Implemented by a backend (cuda/device_grads.h; tests/mpi/fake_device_grads.h for CPU tests).
// Threads: record() and download() are called by the thread that reports on_ready (and calls
// wait()); wait(), download_wait(), upload() and upload_wait() by the communication thread (by the
// reporting thread too when overlap is off). An implementation must allow the two at once.
class DeviceGrads {
 public:
  virtual ~DeviceGrads() = default;
  virtual DevicePath path() const = 0;

  // Set-up, once, from GradientReducer's constructor: the device buffer (`bytes` long) and how
  // many fences and downloads one step makes at most (one per bucket). Everything the steps use
  // is allocated here; nothing after it allocates.
  virtual void setup(void* device, size_t bytes, size_t per_step) = 0;

  // Fence. record() marks the point the device's queued work has reached (all gradients reported
  // so far are final behind it) and returns a token; it must be cheap (no waiting). wait(token)
  // blocks until the device has passed that point. Tokens increase; waiting an old one is cheap.
  virtual uint64_t record() = 0;
  virtual void wait(uint64_t token) = 0;

  // Direct path only: the element arithmetic on device memory, and the memory the allreduce's
  // receive scratch is allocated in (nullptr: host memory).
  virtual const ReduceKernels& kernels() const = 0;
  virtual const MemorySpace* scratch_space() const = 0;

  // Staged path only. host(): the mirror, as long as the device buffer, in host memory (pinned on
  // a GPU). download() queues the copy of device bytes [offset, offset + bytes) into the same
  // bytes of the mirror, ordered after the device work that fence `after` marks, without waiting
  // for either; it returns a ticket for download_wait(), which blocks until that copy has landed.
  // upload() queues the copy of mirror bytes back to the device; upload_wait() blocks until every
  // queued upload has landed, so that host and device may use the buffer afterwards.
  virtual char* host() = 0;
  virtual uint64_t download(size_t offset, size_t bytes, uint64_t after) = 0;
  virtual void download_wait(uint64_t ticket) = 0;
  virtual void upload(size_t offset, size_t bytes) = 0;
  virtual void upload_wait() = 0;

  // Staged path, optional, before setup(): gradient compression converted on the device. The
  // mirror then holds `wire` values (16-bit), element i at host() + i * dtype_size(wire): download
  // converts each fp32 value times `scale` on the device, rounding once, and copies the 16-bit
  // values down (half the bytes); upload copies them up and widens them back. Offsets and byte
  // counts stay those of the fp32 buffer. False (the default): the hooks cannot, and the caller
  // converts on the host.
  virtual bool stage_as(DType wire, float scale) {
    (void)wire;
    (void)scale;
    return false;
  }
};

}  // namespace rt::comm
