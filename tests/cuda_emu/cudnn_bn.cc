// The emulated cuDNN's spatial batch norm (see cudnn.cc for the conventions): statistics per
// channel over N, H, W in double; training keeps the running variance with the unbiased batch
// variance and saves the mean and inverse standard deviation for the backward pass, which
// recomputes them when none are given.
#include <cudnn.h>

#include <cmath>

#include "tests/cuda_emu/cudnn_emu.h"

namespace {

using rt_emu::blend;
using rt_emu::load;
using rt_emu::scalar;
using rt_emu::store;

// Per-channel batch statistics of x (spatial mode): mean and biased variance, in double.
void channel_stats(const cudnnTensorStruct* x, const void* xp, int ch, double* mean, double* var) {
  double s = 0, sq = 0;
  const double m = double(x->n) * x->h * x->w;
  for (int b = 0; b < x->n; ++b)
    for (int i = 0; i < x->h; ++i)
      for (int j = 0; j < x->w; ++j) s += load(x->type, xp, x->at(b, ch, i, j));
  *mean = s / m;
  for (int b = 0; b < x->n; ++b)
    for (int i = 0; i < x->h; ++i)
      for (int j = 0; j < x->w; ++j) {
        const double d = load(x->type, xp, x->at(b, ch, i, j)) - *mean;
        sq += d * d;
      }
  *var = sq / m;
}

}  // namespace

extern "C" {

cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t d,
                                            const cudnnTensorDescriptor_t x,
                                            cudnnBatchNormMode_t mode) {
  if (!d || !x) return CUDNN_STATUS_BAD_PARAM;
  if (mode != CUDNN_BATCHNORM_SPATIAL) return CUDNN_STATUS_NOT_SUPPORTED;
  return rt_emu::set_tensor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, x->c, 1, 1);
}

cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t, cudnnBatchNormMode_t mode, const void* alpha, const void* beta,
    const cudnnTensorDescriptor_t xd, const void* x, const cudnnTensorDescriptor_t yd, void* y,
    const cudnnTensorDescriptor_t pd, const void* scale, const void* bias, double factor,
    void* running_mean, void* running_var, double eps, void* save_mean, void* save_invstd) {
  if (mode != CUDNN_BATCHNORM_SPATIAL || !xd || !yd || !pd || pd->c != xd->c)
    return CUDNN_STATUS_BAD_PARAM;
  if (eps < CUDNN_BN_MIN_EPSILON) return CUDNN_STATUS_BAD_PARAM;
  const double m = double(xd->n) * xd->h * xd->w;
  if (m <= 1) return CUDNN_STATUS_BAD_PARAM;
  for (int ch = 0; ch < xd->c; ++ch) {
    double mean, var;
    channel_stats(xd, x, ch, &mean, &var);
    const double invstd = 1.0 / std::sqrt(var + eps);
    const double g = load(pd->type, scale, ch), b0 = load(pd->type, bias, ch);
    for (int b = 0; b < xd->n; ++b)
      for (int i = 0; i < xd->h; ++i)
        for (int j = 0; j < xd->w; ++j) {
          const double v = (load(xd->type, x, xd->at(b, ch, i, j)) - mean) * invstd * g + b0;
          blend(yd->type, y, yd->at(b, ch, i, j), v, scalar(alpha), scalar(beta));
        }
    if (running_mean)
      store(pd->type, running_mean, ch,
            float((1 - factor) * load(pd->type, running_mean, ch) + factor * mean));
    if (running_var)
      store(pd->type, running_var, ch,
            float((1 - factor) * load(pd->type, running_var, ch) + factor * var * m / (m - 1)));
    if (save_mean) store(pd->type, save_mean, ch, float(mean));
    if (save_invstd) store(pd->type, save_invstd, ch, float(invstd));
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t, cudnnBatchNormMode_t mode, const void* alpha, const void* beta,
    const cudnnTensorDescriptor_t xd, const void* x, const cudnnTensorDescriptor_t yd, void* y,
    const cudnnTensorDescriptor_t pd, const void* scale, const void* bias, const void* mean,
    const void* var, double eps) {
  if (mode != CUDNN_BATCHNORM_SPATIAL || !xd || !yd || !pd || pd->c != xd->c)
    return CUDNN_STATUS_BAD_PARAM;
  if (eps < CUDNN_BN_MIN_EPSILON) return CUDNN_STATUS_BAD_PARAM;
  for (int ch = 0; ch < xd->c; ++ch) {
    const double mu = load(pd->type, mean, ch);
    const double invstd = 1.0 / std::sqrt(double(load(pd->type, var, ch)) + eps);
    const double g = load(pd->type, scale, ch), b0 = load(pd->type, bias, ch);
    for (int b = 0; b < xd->n; ++b)
      for (int i = 0; i < xd->h; ++i)
        for (int j = 0; j < xd->w; ++j) {
          const double v = (load(xd->type, x, xd->at(b, ch, i, j)) - mu) * invstd * g + b0;
          blend(yd->type, y, yd->at(b, ch, i, j), v, scalar(alpha), scalar(beta));
        }
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t, cudnnBatchNormMode_t mode, const void* alpha_data, const void* beta_data,
    const void* alpha_param, const void* beta_param, const cudnnTensorDescriptor_t xd,
    const void* x, const cudnnTensorDescriptor_t dyd, const void* dy,
    const cudnnTensorDescriptor_t dxd, void* dx, const cudnnTensorDescriptor_t pd,
    const void* scale, void* dscale, void* dbias, double eps, const void* saved_mean,
    const void* saved_invstd) {
  if (mode != CUDNN_BATCHNORM_SPATIAL || !xd || !dyd || !dxd || !pd || pd->c != xd->c)
    return CUDNN_STATUS_BAD_PARAM;
  if ((saved_mean == nullptr) != (saved_invstd == nullptr)) return CUDNN_STATUS_BAD_PARAM;
  const double m = double(xd->n) * xd->h * xd->w;
  for (int ch = 0; ch < xd->c; ++ch) {
    double mean, invstd;
    if (saved_mean) {
      mean = load(pd->type, saved_mean, ch);
      invstd = load(pd->type, saved_invstd, ch);
    } else {
      double var;
      channel_stats(xd, x, ch, &mean, &var);
      invstd = 1.0 / std::sqrt(var + eps);
    }
    double sum_g = 0, sum_gx = 0;
    for (int b = 0; b < xd->n; ++b)
      for (int i = 0; i < xd->h; ++i)
        for (int j = 0; j < xd->w; ++j) {
          const double g = load(dyd->type, dy, dyd->at(b, ch, i, j));
          sum_g += g;
          sum_gx += g * (load(xd->type, x, xd->at(b, ch, i, j)) - mean) * invstd;
        }
    const double gamma = load(pd->type, scale, ch);
    for (int b = 0; b < xd->n; ++b)
      for (int i = 0; i < xd->h; ++i)
        for (int j = 0; j < xd->w; ++j) {
          const double g = load(dyd->type, dy, dyd->at(b, ch, i, j));
          const double xhat = (load(xd->type, x, xd->at(b, ch, i, j)) - mean) * invstd;
          const double v = gamma * invstd / m * (m * g - sum_g - xhat * sum_gx);
          blend(dxd->type, dx, dxd->at(b, ch, i, j), v, scalar(alpha_data), scalar(beta_data));
        }
    blend(pd->type, dscale, ch, sum_gx, scalar(alpha_param), scalar(beta_param));
    blend(pd->type, dbias, ch, sum_g, scalar(alpha_param), scalar(beta_param));
  }
  return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"
