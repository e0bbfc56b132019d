// StagingPipeline: schedule from staging_schedule(), copies and waits per slot.
#include "cuda/staging.h"

#include <algorithm>

#include "cuda/check.h"
#include "cuda/memory.h"

namespace rt::cuda {

StagingPipeline::StagingPipeline(size_t chunk_bytes, int slots) : chunk_bytes_(chunk_bytes) {
  staging_schedule(0, chunk_bytes, slots);  // validates the arguments
  try {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (int s = 0; s < slots; ++s) {
      host_.push_back(pinned_malloc(chunk_bytes));
      done_.push_back(nullptr);
      CUDA_CHECK(cudaEventCreateWithFlags(&done_.back(), cudaEventDisableTiming));
    }
  } catch (...) {
    release();
    throw;
  }
}

StagingPipeline::~StagingPipeline() { release(); }

// Never throws (destructor): failures while tearing down (a dead context at exit) are dropped.
void StagingPipeline::release() noexcept {
  if (stream_) cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : done_)
    if (e) cudaEventDestroy(e);
  done_.clear();
  for (void* p : host_) {
    try {
      pinned_free(p, chunk_bytes_);
    } catch (const Error&) {
    }
  }
  host_.clear();
  if (stream_) cudaStreamDestroy(stream_);
  stream_ = nullptr;
}

void StagingPipeline::download(const void* device, size_t bytes, const Consumer& consume) {
  const auto chunks = staging_schedule(bytes, chunk_bytes_, slots());
  const auto* src = static_cast<const char*>(device);
  auto enqueue = [&](const StagingChunk& c) {
    CUDA_CHECK(cudaMemcpyAsync(host_[c.slot], src + c.offset, c.bytes, cudaMemcpyDeviceToHost,
                               stream_));
    CUDA_CHECK(cudaEventRecord(done_[c.slot], stream_));
  };
  // Fill every slot, then: wait for chunk k, hand it over, and reuse its slot for chunk k + slots.
  const size_t ahead = std::min(chunks.size(), size_t(slots()));
  for (size_t k = 0; k < ahead; ++k) enqueue(chunks[k]);
  for (size_t k = 0; k < chunks.size(); ++k) {
    const StagingChunk& c = chunks[k];
    CUDA_CHECK(cudaEventSynchronize(done_[c.slot]));
    consume(host_[c.slot], c.offset, c.bytes);
    if (k + ahead < chunks.size()) enqueue(chunks[k + ahead]);
  }
}

void StagingPipeline::upload(void* device, size_t bytes, const Producer& produce) {
  auto* dst = static_cast<char*>(device);
  for (const StagingChunk& c : staging_schedule(bytes, chunk_bytes_, slots())) {
    // The slot's previous chunk must have left the host before it is overwritten.
    if (c.reuses >= 0) CUDA_CHECK(cudaEventSynchronize(done_[c.slot]));
    produce(host_[c.slot], c.offset, c.bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst + c.offset, host_[c.slot], c.bytes, cudaMemcpyHostToDevice,
                               stream_));
    CUDA_CHECK(cudaEventRecord(done_[c.slot], stream_));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace rt::cuda
