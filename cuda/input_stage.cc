// InputStage: the copy stream, the two slots and their events.
#include "cuda/input_stage.h"

#include "cuda/check.h"

namespace rt::cuda {

InputStage::InputStage(cudaStream_t compute) : compute_(compute) {}

InputStage::~InputStage() {
  if (copy_) cudaStreamSynchronize(copy_);
  for (int i = 0; i < 2; ++i) {
    if (copied_[i]) cudaEventDestroy(copied_[i]);
    if (used_[i]) cudaEventDestroy(used_[i]);
  }
  if (copy_) cudaStreamDestroy(copy_);
}

void InputStage::stage(const void* host, size_t bytes) {
  if (!copy_) {  // on first use: backends that never prefetch create nothing
    CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    // Both slots start free: an event never recorded is complete to a wait. (Recorded on the
    // compute stream, it would hold the first copy behind all the work queued there so far.)
    for (int i = 0; i < 2; ++i) {
      CUDA_CHECK(cudaEventCreateWithFlags(&copied_[i], cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&used_[i], cudaEventDisableTiming));
    }
  }
  cur_ ^= 1;
  if (slot_[cur_].bytes() < bytes) {
    // The old slot may still be read by the compute stream, or written by a copy staged into it
    // and never consumed; cudaFree need not wait for either.
    CUDA_CHECK(cudaEventSynchronize(used_[cur_]));
    CUDA_CHECK(cudaStreamSynchronize(copy_));
    slot_[cur_] = DeviceBuffer(bytes);
  }
  CUDA_CHECK(cudaStreamWaitEvent(copy_, used_[cur_], 0));
  CUDA_CHECK(cudaMemcpyAsync(slot_[cur_].get(), host, bytes, cudaMemcpyHostToDevice, copy_));
  CUDA_CHECK(cudaEventRecord(copied_[cur_], copy_));
  host_ = host;
  bytes_ = bytes;
}

void InputStage::sync() {
  if (copy_) CUDA_CHECK(cudaStreamSynchronize(copy_));
}

void InputStage::begin_use() { CUDA_CHECK(cudaStreamWaitEvent(compute_, copied_[cur_], 0)); }

void InputStage::end_use() {
  CUDA_CHECK(cudaEventRecord(used_[cur_], compute_));
  host_ = nullptr;
  bytes_ = 0;
}

}  // namespace rt::cuda
