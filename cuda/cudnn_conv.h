// Convolution on cuDNN (fp32, NCHW, OIHW weights) as an rt::ConvOp<float> over device pointers:
// descriptors and the three algorithms are chosen once for the shape; the step only executes.
#pragma once
#include <cudnn.h>

#include <cstddef>

#include "cuda/context.h"
#include "nn/ops.h"

namespace rt::cuda {

class CudnnConv final : public ConvOp<float> {
 public:
  // Chooses forward, backward-data and backward-filter algorithms (ctx.config() decides
  // heuristic or timed, deterministic or not, TF32 or not, the workspace limit) and grows the
  // context's workspace to fit them. Throws rt::Error naming the layer when no algorithm fits.
  CudnnConv(const ConvDesc& d, CudaContext& ctx);
  ~CudnnConv() override;
  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;

  // Asynchronous on the context's stream. b and db only with a bias; dx may be null.
  void forward(const float* x, const float* w, const float* b, float* y) override;
  void backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                float* db) override;

  // The chosen algorithms (cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t values) and the
  // workspace they need, for logs.
  int forward_algo() const { return int(fwd_algo_); }
  int backward_data_algo() const { return int(bwd_data_algo_); }
  int backward_filter_algo() const { return int(bwd_filter_algo_); }
  size_t workspace_bytes() const { return workspace_; }

 private:
  void release() noexcept;
  ConvDesc d_;
  CudaContext& ctx_;
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr, bias_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  // One per direction: each carries the math type of its own algorithm.
  cudnnConvolutionDescriptor_t fwd_ = nullptr, bwd_data_ = nullptr, bwd_filter_ = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_algo_{};
  cudnnConvolutionBwdDataAlgo_t bwd_data_algo_{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo_{};
  size_t workspace_ = 0;
};

}  // namespace rt::cuda
