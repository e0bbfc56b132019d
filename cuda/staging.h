// Pinned host staging for device buffers when MPI cannot read GPU memory: chunked copies on a
// private stream, overlapped with the host's use of the previous chunk.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "cuda/staging_schedule.h"

namespace rt::cuda {

class StagingPipeline {
 public:
  // Allocates `slots` pinned buffers of chunk_bytes and one stream and event per slot, once.
  // Two slots double-buffer; more help when the consumer's time per chunk varies.
  StagingPipeline(size_t chunk_bytes, int slots = 2);
  ~StagingPipeline();
  StagingPipeline(const StagingPipeline&) = delete;
  StagingPipeline& operator=(const StagingPipeline&) = delete;

  // The copies run on the pipeline's own stream, unordered with the caller's: work that writes
  // download's device buffer, or reads or writes upload's, must be finished (its stream
  // synchronised) before the call.
  //
  // Device -> host: consume(host, offset, n) is called for each chunk in order, with host valid
  // only during the call, while the following chunks are already being copied.
  using Consumer = std::function<void(const void* host, size_t offset, size_t n)>;
  void download(const void* device, size_t bytes, const Consumer& consume);

  // Host -> device: produce(host, offset, n) fills each chunk in order; the copy of one chunk
  // overlaps the production of the next. Returns when everything has arrived on the device.
  using Producer = std::function<void(void* host, size_t offset, size_t n)>;
  void upload(void* device, size_t bytes, const Producer& produce);

  size_t chunk_bytes() const { return chunk_bytes_; }
  int slots() const { return int(host_.size()); }

 private:
  void release() noexcept;
  size_t chunk_bytes_;
  std::vector<void*> host_;          // pinned, one per slot
  std::vector<cudaEvent_t> done_;    // per slot: its last copy finished
  cudaStream_t stream_ = nullptr;
};

}  // namespace rt::cuda
