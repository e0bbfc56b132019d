// Fully connected layer on cuBLAS (fp32) as an rt::LinearOp<float> over device pointers:
// y[n][o] = sum_i x[n][i] w[o][i] + b[o], weights [out][in] as in the arena.
#pragma once
#include "cuda/context.h"
#include "cuda/memory.h"
#include "nn/ops.h"

namespace rt::cuda {

class CublasLinear final : public LinearOp<float> {
 public:
  // Allocates a vector of ones (batch length) for the bias terms, once. Throws rt::ShapeError
  // when a dimension does not fit cuBLAS's int.
  CublasLinear(const LinearDesc& d, CudaContext& ctx);

  // Asynchronous on the context's stream. b and db only with a bias; dx may be null.
  void forward(const float* x, const float* w, const float* b, float* y) override;
  void backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                float* db) override;

 private:
  LinearDesc d_;
  CudaContext& ctx_;
  int n_ = 0, in_ = 0, out_ = 0;
  DeviceBuffer ones_;
};

}  // namespace rt::cuda
