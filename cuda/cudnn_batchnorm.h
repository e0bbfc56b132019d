// Batch normalisation on cuDNN (fp32, NCHW, spatial mode) as an rt::BatchNormOp<float> over
// device pointers, with the fused ReLU done by our own kernels.
#pragma once
#include <cudnn.h>

#include "cuda/context.h"
#include "nn/ops.h"

namespace rt::cuda {

// Device memory ops borrow while they execute: ops run one after another on one stream, so one
// buffer, grown at set-up to the largest request, serves all of them. Growing frees the old
// buffer without waiting for the stream: ops reserve while they are built, before any step.
class SharedScratch {
 public:
  void reserve(size_t bytes) {
    if (bytes > buf_.bytes()) buf_ = DeviceBuffer(bytes);
  }
  void* get() const { return buf_.get(); }  // fetched per call: reserve() may reallocate

 private:
  DeviceBuffer buf_;
};

class CudnnBatchNorm final : public BatchNormOp<float> {
 public:
  // Throws ShapeError naming the layer for eps below cuDNN's minimum (CUDNN_BN_MIN_EPSILON, 0 in
  // cuDNN 9; BatchNormDesc already refuses eps <= 0) or an input over 2^31 - 1 elements.
  CudnnBatchNorm(const BatchNormDesc& d, CudaContext& ctx, SharedScratch& scratch);
  ~CudnnBatchNorm() override;
  CudnnBatchNorm(const CudnnBatchNorm&) = delete;
  CudnnBatchNorm& operator=(const CudnnBatchNorm&) = delete;
  // All asynchronous on the context's stream. cuDNN matches PyTorch's semantics: the biased
  // batch variance normalises, the unbiased one enters running_var with factor momentum.
  void forward_train(const float* x, const float* gamma, const float* beta, float* y,
                     float* running_mean, float* running_var) override;
  void forward_eval(const float* x, const float* gamma, const float* beta,
                    const float* running_mean, const float* running_var, float* y) override;
  // Uses the mean and inverse standard deviation cuDNN saved in the last forward_train.
  void backward(const float* x, const float* gamma, const float* y, const float* dy, float* dx,
                float* dgamma, float* dbeta) override;

 private:
  void release() noexcept;
  BatchNormDesc d_;
  CudaContext& ctx_;
  SharedScratch& scratch_;
  cudnnTensorDescriptor_t x_ = nullptr, param_ = nullptr;
  DeviceBuffer saved_mean_, saved_inv_std_;
};

}  // namespace rt::cuda
