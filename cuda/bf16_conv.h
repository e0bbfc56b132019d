// Convolution for the bf16 backend (cuda-bf16): cuDNN on NHWC bf16 activations with fp32
// accumulation on tensor cores, as an rt::ConvOp<float> whose x, y, dy, dx are bf16 NHWC device
// buffers (passed as float*) and whose w, b, dw, db are the arena's fp32 canonical tensors.
#pragma once
#include <cudnn.h>

#include <cstddef>

#include "cuda/bf16_layout.h"
#include "cuda/context.h"
#include "cuda/memory.h"
#include "nn/ops.h"

namespace rt::cuda {

class Bf16Conv final : public ConvOp<float> {
 public:
  // Chooses the three algorithms once for the shape (ctx.config(): timed or heuristic,
  // deterministic or not, workspace limit), grows the context's workspace and allocates the
  // private bf16 weight and weight-gradient copies (KRSC). Throws rt::Error naming the layer
  // when no algorithm fits.
  Bf16Conv(const ConvDesc& d, CudaContext& ctx);
  ~Bf16Conv() override;
  Bf16Conv(const Bf16Conv&) = delete;
  Bf16Conv& operator=(const Bf16Conv&) = delete;

  // Asynchronous on the context's stream. Each call first casts w (fp32 OIHW) to the private
  // bf16 KRSC copy, so the op never uses stale weights. dw (and db) are overwritten in fp32:
  // cuDNN computes dw in bf16 (fp32 accumulation, one rounding), then it is widened.
  void forward(const float* x, const float* w, const float* b, float* y) override;
  void backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                float* db) override;

 private:
  void release() noexcept;
  ConvDesc d_;
  CudaContext& ctx_;
  WeightGeom wg_;
  int64_t out_rows_ = 0;  // n * out_h * out_w
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t fwd_ = nullptr, bwd_data_ = nullptr, bwd_filter_ = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_algo_{};
  cudnnConvolutionBwdDataAlgo_t bwd_data_algo_{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo_{};
  size_t workspace_ = 0;
  DeviceBuffer w16_, dw16_;
  ChannelReduceGeom bias_geom_;  // db: sums of dy over its rows
  DeviceBuffer bias_partial_;
};

}  // namespace rt::cuda
