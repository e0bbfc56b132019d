// The emulated cuDNN's spatial batch norm (see cudnn.cc for the conventions): statistics per
// channel over N, H, W in double; training keeps the running variance with the unbiased batch
// variance and saves the mean and inverse standard deviation for the backward pass, which
// recomputes them when none are given.
#include <cudnn.h>

#include <cmath>

#include "tests/cuda_emu/cudnn_emu.h"
#include "tests/cuda_emu/streams.h"

namespace {

using rt_emu::blend;
using rt_emu::load;
using rt_emu::scalar;
using rt_emu::store;

// Calls f(element index) for every value of channel ch of t (N, H, W).
template <class F>
void each_in_channel(const cudnnTensorStruct* t, int ch, F&& f) {
  for (int b = 0; b < t->n; ++b)
    for (int i = 0; i < t->h; ++i)
      for (int j = 0; j < t->w; ++j) f(t->at(b, ch, i, j));
}

double values_per_channel(const cudnnTensorStruct* t) { return double(t->n) * t->h * t->w; }

// Tensors that one element index walks together: same dimensions, same layout.
bool same_layout(const cudnnTensorStruct* a, const cudnnTensorStruct* b) {
  return a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w && a->nhwc == b->nhwc;
}

// Per-channel batch statistics of x (spatial mode): mean and biased variance, in double.
void channel_stats(const cudnnTensorStruct* x, const void* xp, int ch, double* mean, double* var) {
  double s = 0, sq = 0;
  each_in_channel(x, ch, [&](int64_t at) { s += load(x->type, xp, at); });
  *mean = s / values_per_channel(x);
  each_in_channel(x, ch, [&](int64_t at) {
    const double d = load(x->type, xp, at) - *mean;
    sq += d * d;
  });
  *var = sq / values_per_channel(x);
}

// y = alpha ((x - mean) invstd gamma + shift) + beta y over channel ch (x, y: same_layout).
void normalize_channel(const cudnnTensorStruct* xd, const void* x, const cudnnTensorStruct* yd,
                       void* y, int ch, double mean, double invstd, double gamma, double shift,
                       const void* alpha, const void* beta) {
  each_in_channel(xd, ch, [&](int64_t at) {
    const double v = (load(xd->type, x, at) - mean) * invstd * gamma + shift;
    blend(yd->type, y, at, v, scalar(alpha), scalar(beta));
  });
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
    cudnnHandle_t h, cudnnBatchNormMode_t mode, const void* alpha, const void* beta,
    const cudnnTensorDescriptor_t xd, const void* x, const cudnnTensorDescriptor_t yd, void* y,
    const cudnnTensorDescriptor_t pd, const void* scale, const void* bias, double factor,
    void* running_mean, void* running_var, double eps, void* save_mean, void* save_invstd) {
  if (!h || mode != CUDNN_BATCHNORM_SPATIAL || !xd || !yd || !pd || pd->c != xd->c ||
      !same_layout(xd, yd))
    return CUDNN_STATUS_BAD_PARAM;
  if (eps < CUDNN_BN_MIN_EPSILON) return CUDNN_STATUS_BAD_PARAM;
  const double m = values_per_channel(xd);
  if (m <= 1) return CUDNN_STATUS_BAD_PARAM;
  rt_emu::enqueue(h->stream, [=, xd = *xd, yd = *yd, pd = *pd, al = scalar(alpha),
                              be = scalar(beta)] {
    for (int ch = 0; ch < xd.c; ++ch) {
      double mean, var;
      channel_stats(&xd, x, ch, &mean, &var);
      const double invstd = 1.0 / std::sqrt(var + eps);
      normalize_channel(&xd, x, &yd, y, ch, mean, invstd, load(pd.type, scale, ch),
                        load(pd.type, bias, ch), &al, &be);
      if (running_mean)
        store(pd.type, running_mean, ch,
              float((1 - factor) * load(pd.type, running_mean, ch) + factor * mean));
      if (running_var)
        store(pd.type, running_var, ch,
              float((1 - factor) * load(pd.type, running_var, ch) + factor * var * m / (m - 1)));
      if (save_mean) store(pd.type, save_mean, ch, float(mean));
      if (save_invstd) store(pd.type, save_invstd, ch, float(invstd));
    }
  });
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t h, cudnnBatchNormMode_t mode, const void* alpha, const void* beta,
    const cudnnTensorDescriptor_t xd, const void* x, const cudnnTensorDescriptor_t yd, void* y,
    const cudnnTensorDescriptor_t pd, const void* scale, const void* bias, const void* mean,
    const void* var, double eps) {
  if (!h || mode != CUDNN_BATCHNORM_SPATIAL || !xd || !yd || !pd || pd->c != xd->c ||
      !same_layout(xd, yd))
    return CUDNN_STATUS_BAD_PARAM;
  if (eps < CUDNN_BN_MIN_EPSILON) return CUDNN_STATUS_BAD_PARAM;
  rt_emu::enqueue(h->stream, [=, xd = *xd, yd = *yd, pd = *pd, al = scalar(alpha),
                              be = scalar(beta)] {
    for (int ch = 0; ch < xd.c; ++ch) {
      const double invstd = 1.0 / std::sqrt(double(load(pd.type, var, ch)) + eps);
      normalize_channel(&xd, x, &yd, y, ch, load(pd.type, mean, ch), invstd,
                        load(pd.type, scale, ch), load(pd.type, bias, ch), &al, &be);
    }
  });
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t h, cudnnBatchNormMode_t mode, const void* alpha_data, const void* beta_data,
    const void* alpha_param, const void* beta_param, const cudnnTensorDescriptor_t xd,
    const void* x, const cudnnTensorDescriptor_t dyd, const void* dy,
    const cudnnTensorDescriptor_t dxd, void* dx, const cudnnTensorDescriptor_t pd,
    const void* scale, void* dscale, void* dbias, double eps, const void* saved_mean,
    const void* saved_invstd) {
  if (!h || mode != CUDNN_BATCHNORM_SPATIAL || !xd || !dyd || !dxd || !pd || pd->c != xd->c ||
      !same_layout(xd, dyd) || !same_layout(xd, dxd))
    return CUDNN_STATUS_BAD_PARAM;
  if ((saved_mean == nullptr) != (saved_invstd == nullptr)) return CUDNN_STATUS_BAD_PARAM;
  rt_emu::enqueue(h->stream, [=, xd = *xd, dyd = *dyd, dxd = *dxd, pd = *pd,
                              ad = scalar(alpha_data), bd = scalar(beta_data),
                              ap = scalar(alpha_param), bp = scalar(beta_param)] {
    const double m = values_per_channel(&xd);
    for (int ch = 0; ch < xd.c; ++ch) {
      double mean, invstd;
      if (saved_mean) {
        mean = load(pd.type, saved_mean, ch);
        invstd = load(pd.type, saved_invstd, ch);
      } else {
        double var;
        channel_stats(&xd, x, ch, &mean, &var);
        invstd = 1.0 / std::sqrt(var + eps);
      }
      // x, dy and dx: same_layout, so one index walks all three.
      double sum_g = 0, sum_gx = 0;
      each_in_channel(&xd, ch, [&](int64_t at) {
        const double g = load(dyd.type, dy, at);
        sum_g += g;
        sum_gx += g * (load(xd.type, x, at) - mean) * invstd;
      });
      const double gamma = load(pd.type, scale, ch);
      each_in_channel(&xd, ch, [&](int64_t at) {
        const double g = load(dyd.type, dy, at);
        const double xhat = (load(xd.type, x, at) - mean) * invstd;
        const double v = gamma * invstd / m * (m * g - sum_g - xhat * sum_gx);
        blend(dxd.type, dx, at, v, ad, bd);
      });
      blend(pd.type, dscale, ch, sum_gx, ap, bp);
      blend(pd.type, dbias, ch, sum_g, ap, bp);
    }
  });
  return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"
