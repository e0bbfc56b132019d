// CudnnBatchNorm: descriptors at set-up; the step calls cuDNN's legacy batch-norm API (present
// in cuDNN 9) and our ReLU kernels around it.
#include "cuda/cudnn_batchnorm.h"

#include <climits>

#include "cuda/check.h"
#include "cuda/layer_kernels.h"

namespace rt::cuda {
namespace {

// Spatial mode: statistics per channel over N, H, W. (SPATIAL_PERSISTENT is faster, and
// deterministic, but its scaled integer reduction may overflow to Inf/NaN on large inputs.)
constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL;

}  // namespace

CudnnBatchNorm::CudnnBatchNorm(const BatchNormDesc& d, CudaContext& ctx, SharedScratch& scratch)
    : d_(d), ctx_(ctx), scratch_(scratch) {
  d_.validate();
  RT_SHAPE_CHECK(d_.eps >= CUDNN_BN_MIN_EPSILON, "layer ", d_.name, ": batch norm eps ", d_.eps,
                 " is below cuDNN's minimum ", CUDNN_BN_MIN_EPSILON);
  check_cudnn_numel(d_.in, d_);
  try {
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&param_));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                           lib_int(d_.in.n, d_), lib_int(d_.in.c, d_),
                                           lib_int(d_.in.h, d_), lib_int(d_.in.w, d_)));
    CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(param_, x_, kMode));
    saved_mean_ = DeviceBuffer(size_t(d_.in.c) * sizeof(float));
    saved_inv_std_ = DeviceBuffer(size_t(d_.in.c) * sizeof(float));
    if (d_.relu) scratch_.reserve(size_t(d_.in.numel()) * sizeof(float));
  } catch (...) {  // out of device memory included: no destructor runs for a half-made op
    release();
    throw;
  }
}

CudnnBatchNorm::~CudnnBatchNorm() { release(); }

void CudnnBatchNorm::release() noexcept {
  if (x_) cudnnDestroyTensorDescriptor(x_);
  if (param_) cudnnDestroyTensorDescriptor(param_);
  x_ = param_ = nullptr;
}

void CudnnBatchNorm::forward_train(const float* x, const float* gamma, const float* beta,
                                   float* y, float* running_mean, float* running_var) {
  // As PyTorch: the unbiased variance of one value per channel is undefined.
  RT_SHAPE_CHECK(d_.in.n * d_.in.h * d_.in.w > 1, "layer ", d_.name,
                 ": batch norm training needs more than one value per channel, got input ",
                 d_.in.str());
  const float one = 1, zero = 0;
  CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      ctx_.cudnn(), kMode, &one, &zero, x_, x, x_, y, param_, gamma, beta, d_.momentum,
      running_mean, running_var, d_.eps, saved_mean_.as<float>(), saved_inv_std_.as<float>()));
  if (d_.relu) relu_forward(y, y, d_.in.numel(), ctx_.stream());
}

void CudnnBatchNorm::forward_eval(const float* x, const float* gamma, const float* beta,
                                  const float* running_mean, const float* running_var, float* y) {
  const float one = 1, zero = 0;
  CUDNN_CHECK(cudnnBatchNormalizationForwardInference(ctx_.cudnn(), kMode, &one, &zero, x_, x,
                                                      x_, y, param_, gamma, beta, running_mean,
                                                      running_var, d_.eps));
  if (d_.relu) relu_forward(y, y, d_.in.numel(), ctx_.stream());
}

void CudnnBatchNorm::backward(const float* x, const float* gamma, const float* y,
                              const float* dy, float* dx, float* dgamma, float* dbeta) {
  const float* g = dy;
  if (d_.relu) {  // the ReLU's mask from y, into scratch: dy belongs to the caller
    float* masked = static_cast<float*>(scratch_.get());
    relu_backward(y, dy, masked, d_.in.numel(), ctx_.stream());
    g = masked;
  }
  const float one = 1, zero = 0;
  CUDNN_CHECK(cudnnBatchNormalizationBackward(
      ctx_.cudnn(), kMode, &one, &zero, &one, &zero, x_, x, x_, g, x_, dx, param_, gamma, dgamma,
      dbeta, d_.eps, saved_mean_.as<float>(), saved_inv_std_.as<float>()));
}

}  // namespace rt::cuda
