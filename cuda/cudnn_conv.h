// Convolution on cuDNN (fp32, NCHW, OIHW weights) as an rt::ConvOp<float> over device pointers:
// descriptors and the three algorithms are chosen once for the shape; the step only executes.
#pragma once
#include <cudnn.h>

#include <cstddef>
#include <optional>

#include "cuda/context.h"
#include "cuda/conv_run.h"
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
  // backward_add_dx: dx += the input gradient (cuDNN's beta = 1), rounded once.
  bool adds_dx() const override { return d_.input_grad; }
  void backward_add_dx(const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db) override {
    run_backward(x, w, dy, dx, dw, db, 1.0f);
  }
  void backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                float* db) override;

  // The algorithms in use (cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t values; a first run
  // cuDNN refuses moves to another, conv_run.h) and the workspace they need, for logs.
  int forward_algo() const { return int(run_->algos().fwd); }
  int backward_data_algo() const { return int(run_->algos().bwd_data); }
  int backward_filter_algo() const { return int(run_->algos().bwd_filter); }
  size_t workspace_bytes() const { return run_->workspace(); }

 private:
  // backward, dx scaled by dx_beta before the gradient is added (0: overwritten).
  void run_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                    float dx_beta);
  void release() noexcept;
  ConvDesc d_;
  CudaContext& ctx_;
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr, bias_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  // One per direction: each carries the math type of its own algorithm.
  cudnnConvolutionDescriptor_t fwd_ = nullptr, bwd_data_ = nullptr, bwd_filter_ = nullptr;
  std::optional<ConvRunner> run_;  // the algorithms, once chosen
};

}  // namespace rt::cuda
