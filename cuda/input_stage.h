// Input prefetch for the CUDA backends (Backend::stage_input): the next batch's host bytes go to
// one of two device slots on a copy stream of their own while the compute stream still runs the
// current step; the import of the same host pointer then waits for that copy (an event) and
// reads the slot. A slot is refilled only after the compute stream has used it (another event).
// From page-locked memory (Backend::input_memory) the copy runs while the host goes on: its bytes
// must stay until the backend's next sync(), which waits for the copy too (sync() here). From
// pageable memory the call returns only once the driver has taken the bytes, the host waiting
// for most of the copy.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/memory.h"

namespace rt::cuda {

class InputStage {
 public:
  explicit InputStage(cudaStream_t compute);
  ~InputStage();
  InputStage(const InputStage&) = delete;
  InputStage& operator=(const InputStage&) = delete;

  // Starts copying bytes from host into the next slot (grown on first use only).
  void stage(const void* host, size_t bytes);
  // Waits for the copy last started (nothing when none was).
  void sync();
  // When host (with bytes) is what was staged last: makes the compute stream wait for its copy,
  // calls use(device bytes) to queue the consumer on the compute stream, marks the slot free after
  // it, forgets the staging and returns true. Otherwise false (nothing staged for it).
  template <class F>
  bool consume(const void* host, size_t bytes, F&& use) {
    if (!host || host != host_ || bytes != bytes_) return false;
    begin_use();
    use(static_cast<const void*>(slot_[cur_].get()));
    end_use();
    return true;
  }

 private:
  void begin_use();
  void end_use();

  cudaStream_t compute_, copy_ = nullptr;
  cudaEvent_t copied_[2] = {}, used_[2] = {};
  DeviceBuffer slot_[2];
  int cur_ = 1;  // the slot staged last; the first stage() takes slot 0
  const void* host_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace rt::cuda
