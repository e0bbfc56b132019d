// Softmax cross-entropy with label smoothing on the device, as an rt::SoftmaxXentOp<float>:
// logits, labels and dlogits are device pointers; the loss comes back to the host.
#pragma once
#include <cuda_runtime.h>

#include "cuda/memory.h"
#include "nn/ops.h"

namespace rt::cuda {

class DeviceSoftmaxXent final : public SoftmaxXentOp<float> {
 public:
  // Allocates the probability, row-loss and result buffers once (the result's page-locked mirror
  // too); kernels run on `stream`.
  DeviceSoftmaxXent(const SoftmaxXentDesc& d, cudaStream_t stream);
  ~DeviceSoftmaxXent() override;
  DeviceSoftmaxXent(const DeviceSoftmaxXent&) = delete;
  DeviceSoftmaxXent& operator=(const DeviceSoftmaxXent&) = delete;
  // Waits for the stream to return the mean loss (one wait, one copy); throws rt::Error naming a
  // row whose label is outside [0, classes).
  double forward(const float* logits, const int32_t* labels) override;
  // Asynchronous; labels must be those given to the last forward (already checked there).
  void backward(const int32_t* labels, float* dlogits, double scale = 1.0) override;

 private:
  SoftmaxXentDesc d_;
  cudaStream_t stream_;
  // The mean loss and the bad-row flag side by side, on the device and in pinned host memory, so
  // that one copy brings both back.
  struct Result {
    double mean_loss;
    int bad_row;
  };
  DeviceBuffer prob_, row_loss_, result_;
  Result* host_result_ = nullptr;
};

}  // namespace rt::cuda
