// The loss (softmax cross-entropy or BCE, label smoothing) on the device, as an rt::SoftmaxXentOp<float>:
// logits and dlogits are device pointers, labels host memory (the Net's); nothing in forward
// waits for the device, and the loss comes back when loss() asks for it.
#pragma once
#include <cuda_runtime.h>

#include "cuda/memory.h"
#include "cuda/softmax_xent_kernel.h"
#include "nn/ops.h"

namespace rt::cuda {

class DeviceSoftmaxXent final : public SoftmaxXentOp<float> {
 public:
  // Allocates the probability, row-loss, label and result buffers once (a page-locked mirror of
  // the labels and the result too); kernels run on `stream`.
  DeviceSoftmaxXent(const SoftmaxXentDesc& d, cudaStream_t stream);
  ~DeviceSoftmaxXent() override;
  DeviceSoftmaxXent(const DeviceSoftmaxXent&) = delete;
  DeviceSoftmaxXent& operator=(const DeviceSoftmaxXent&) = delete;
  // Queues the labels' upload (both sets of blended targets), the loss and its copy back. The labels go
  // through the page-locked mirror: an upload straight from pageable memory may make the host
  // wait for the stream.
  void forward(const float* logits, const Targets& t) override;
  // Waits for the last forward's result only (an event after its copy back); throws rt::Error
  // naming a row whose label is outside [0, classes) (backward treats such a row as having no
  // label, so nothing was written out of bounds meanwhile).
  double loss() override;
  // Asynchronous; uses the device copy of the last forward's targets (the argument is ignored).
  void backward(const Targets& t, float* dlogits, double scale = 1.0) override;

 private:
  XentArgs args() const;  // the kernels' arguments for the last forward's targets, but logits

  SoftmaxXentDesc d_;
  cudaStream_t stream_;
  // The mean loss and the bad-row flag side by side, on the device and in pinned host memory, so
  // that one copy brings both back; the pinned block holds the labels' mirror after them.
  struct Result {
    double mean_loss;
    int bad_row;
  };
  DeviceBuffer prob_, row_loss_, labels_, result_;
  Result* host_result_ = nullptr;
  int32_t* host_labels_ = nullptr;  // n labels, then n mixed-in labels when mixed_
  bool mixed_ = false;
  float mix_ = 1;
  size_t pinned_bytes_ = 0;
  cudaEvent_t done_ = nullptr;  // after the last forward's copy back
};

}  // namespace rt::cuda
