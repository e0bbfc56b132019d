// Softmax cross-entropy with label smoothing on the device, as an rt::SoftmaxXentOp<float>:
// logits, labels and dlogits are device pointers; the loss comes back to the host.
#pragma once
#include <cuda_runtime.h>

#include "cuda/memory.h"
#include "nn/ops.h"

namespace rt::cuda {

class DeviceSoftmaxXent final : public SoftmaxXentOp<float> {
 public:
  // Allocates the probability, row-loss and flag buffers once; kernels run on `stream`.
  DeviceSoftmaxXent(const SoftmaxXentDesc& d, cudaStream_t stream);
  // Waits for the stream to return the mean loss; throws rt::Error naming a row whose label is
  // outside [0, classes).
  double forward(const float* logits, const int32_t* labels) override;
  // Asynchronous; labels must be those given to the last forward (already checked there).
  void backward(const int32_t* labels, float* dlogits, double scale = 1.0) override;

 private:
  SoftmaxXentDesc d_;
  cudaStream_t stream_;
  DeviceBuffer prob_, row_loss_, mean_, bad_;
};

}  // namespace rt::cuda
