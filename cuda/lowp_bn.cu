// Batch normalisation of the 16-bit backends (NHWC, fp32 statistics; see lowp_kernels.h): the
// training statistics and the inference scale per channel, the apply (with a residual and ReLU)
// and the backward. On the vector grid of lowp_layout.h where the channels are a multiple of kVec
// and the buffers 16-byte aligned (a thread owns kVec channels, loads 16 bytes per row and keeps
// its channels' parameters in registers), else one element per thread. The sums they use are
// lowp_channel_sums.cu's.
#include "cuda/check.h"
#include "cuda/lowp_bn.cuh"

namespace rt::cuda {
namespace {

using namespace lowp;

__global__ void train_stats_kernel(BnStatsArgs a) {
  for (int64_t c = first_index(); c < a.channels; c += grid_stride())
    train_stats_of(a, c, a.mean[c], a.var_sum[c]);
}

__global__ void eval_scale_kernel(const float* gamma, const float* running_var, double eps,
                                  float* scale, int64_t channels) {
  for (int64_t c = first_index(); c < channels; c += grid_stride())
    scale[c] = float(double(gamma[c]) / sqrt(double(running_var[c]) + eps));
}

// The value bn_apply stores, before its rounding: with a residual, the batch norm's own output
// (rounded to T) plus r, as a separate add would compute it.
template <class T>
__device__ inline float bn_out(float v, const T* r, float rv) {
  return r ? to_f32(rn<T>(v)) + rv : v;
}

template <class T>
__global__ void bn_apply_kernel(const T* x, const T* r, const float* mean, const float* scale,
                                const float* beta, T* y, ChannelReduceGeom g, bool relu) {
  const int64_t n = g.rows * g.channels;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t c = i % g.channels;
    const float v = bn_out(bn_value(ld(x, i), mean[c], scale[c], beta[c]), r, r ? ld(r, i) : 0.0f);
    y[i] = rn<T>(relu ? relu_value(v) : v);
  }
}

template <class T>
__global__ void bn_apply_vec_kernel(const T* x, const T* res, const float* mean_p,
                                    const float* scale_p, const float* beta_p, T* y,
                                    ChannelReduceGeom g, bool relu) {
  const VecPlace p = vec_place(g);
  const int64_t groups = p.groups, grp = p.grp, r0 = p.r0, r1 = p.r1;
  if (grp >= groups) return;
  float mean[kVec], scale[kVec], beta[kVec];
  load_channels(mean_p, grp * kVec, mean);
  load_channels(scale_p, grp * kVec, scale);
  load_channels(beta_p, grp * kVec, beta);
  uint4 bx[kRowBatch], br[kRowBatch];
  batched_rows<kRowBatch>(
      r0 + threadIdx.y, r1, g.vec_rows,
      [&](int j, int64_t r) {
        bx[j] = load_raw(x, r * groups + grp);
        if (res) br[j] = load_raw(res, r * groups + grp);
      },
      [&](int j, int64_t r) {  // y may be x or res: row r of both was loaded above
        float e[kVec], er[kVec] = {};
        widen<T>(bx[j], e);
        if (res) widen<T>(br[j], er);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float b = bn_out(bn_value(e[k], mean[k], scale[k], beta[k]), res, er[k]);
          e[k] = relu ? relu_value(b) : b;
        }
        store_vec(y, r * groups + grp, e);
      });
}

// dx = gamma invstd (g - sum_g / m - xhat sum_gxhat / m). The multiply-add and the subtraction
// are written out: nvcc would fuse a multiply and an add where it chooses (the element grid's
// sum_g / m into g - mean_g, say, which the vector grid computes before its loop), on the device
// and not in the emulator, so both grids and both builds round them the same way.
__device__ inline float bn_dx(float g, float xhat, float gamma_invstd, float mean_g,
                              float mean_gxhat) {
  return gamma_invstd * __fmaf_rn(-xhat, mean_gxhat, __fsub_rn(g, mean_g));
}

template <class T>
__global__ void bn_backward_kernel(BnBackwardArgs<T> a, ChannelReduceGeom g) {
  const int64_t n = g.rows * g.channels;
  const float inv_m = 1.0f / float(a.m > 0 ? a.m : g.rows);
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t c = i % g.channels;
    const float x = ld(a.x, i), mean = a.mean[c], invstd = a.invstd[c];
    const bool pass = !a.relu || bn_passes<T>(bn_value(x, mean, a.scale[c], a.beta[c]));
    const float g = pass ? ld(a.dy, i) : 0.0f;
    a.dx[i] = rn<T>(bn_dx(g, (x - mean) * invstd, a.gamma[c] * invstd, a.sum_g[c] * inv_m,
                          a.sum_gxhat[c] * inv_m));
  }
}

template <class T>
__global__ void bn_backward_vec_kernel(BnBackwardArgs<T> a, ChannelReduceGeom g) {
  const VecPlace p = vec_place(g);
  const int64_t groups = p.groups, grp = p.grp, c0 = p.c0, r0 = p.r0, r1 = p.r1;
  if (grp >= groups) return;
  const float inv_m = 1.0f / float(a.m > 0 ? a.m : g.rows);
  float mean[kVec], invstd[kVec], gi[kVec], mg[kVec], mgx[kVec], scale[kVec] = {}, beta[kVec] = {};
  load_channels(a.mean, c0, mean);
  load_channels(a.invstd, c0, invstd);
  load_channels(a.gamma, c0, gi);
  load_channels(a.sum_g, c0, mg);
  load_channels(a.sum_gxhat, c0, mgx);
  if (a.relu) {
    load_channels(a.scale, c0, scale);
    load_channels(a.beta, c0, beta);
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {  // the scalar kernel's products, in its order
    gi[k] = gi[k] * invstd[k];
    mg[k] = mg[k] * inv_m;
    mgx[k] = mgx[k] * inv_m;
  }
  uint4 bx[kRowBatch2], bd[kRowBatch2];
  batched_rows<kRowBatch2>(
      r0 + threadIdx.y, r1, g.vec_rows,
      [&](int j, int64_t r) {
        bx[j] = load_raw(a.x, r * groups + grp);
        bd[j] = load_raw(a.dy, r * groups + grp);
      },
      [&](int j, int64_t r) {
        float x[kVec], d[kVec];
        widen<T>(bx[j], x);
        widen<T>(bd[j], d);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const bool pass = !a.relu || bn_passes<T>(bn_value(x[k], mean[k], scale[k], beta[k]));
          d[k] = bn_dx(pass ? d[k] : 0.0f, (x[k] - mean[k]) * invstd[k], gi[k], mg[k], mgx[k]);
        }
        store_vec(a.dx, r * groups + grp, d);  // dx may alias dy: row r of dy was loaded above
      });
}

}  // namespace

void bn_train_stats(const BnStatsArgs& a, cudaStream_t stream) {
  if (a.channels <= 0) return;
  train_stats_kernel<<<blocks_for(a.channels), kThreads, 0, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

void bn_eval_scale(const float* gamma, const float* running_var, double eps, float* scale,
                   int64_t channels, cudaStream_t stream) {
  if (channels <= 0) return;
  eval_scale_kernel<<<blocks_for(channels), kThreads, 0, stream>>>(gamma, running_var, eps, scale,
                                                                  channels);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void bn_apply(const T* x, const T* residual, const float* mean, const float* scale, const float* beta,
              T* y, const ChannelReduceGeom& g, bool relu, cudaStream_t stream) {
  const int64_t n = g.rows * g.channels;
  if (n <= 0) return;
  if (on_vec_grid(g, {x, y, residual}))
    bn_apply_vec_kernel<T><<<vec_grid(g), vec_block(g), 0, stream>>>(x, residual, mean, scale, beta,
                                                                     y, g, relu);
  else
    bn_apply_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(x, residual, mean, scale, beta, y, g,
                                                               relu);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void bn_backward_dx(const BnBackwardArgs<T>& a, const ChannelReduceGeom& g, cudaStream_t stream) {
  const int64_t n = g.rows * g.channels;
  if (n <= 0 || !a.dx) return;
  if (on_vec_grid(g, {a.x, a.dy, a.dx}))
    bn_backward_vec_kernel<T><<<vec_grid(g), vec_block(g), 0, stream>>>(a, g);
  else
    bn_backward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(a, g);
  CUDA_CHECK_LAUNCH();
}

#define RT_LOWP_BN_INSTANTIATE(T)                                                               \
  template void bn_apply(const T*, const T*, const float*, const float*, const float*, T*,       \
                         const ChannelReduceGeom&, bool, cudaStream_t);                          \
  template void bn_backward_dx(const BnBackwardArgs<T>&, const ChannelReduceGeom&, cudaStream_t);
RT_LOWP_BN_INSTANTIATE(bf16)
RT_LOWP_BN_INSTANTIATE(f16)
#undef RT_LOWP_BN_INSTANTIATE

}  // namespace rt::cuda
