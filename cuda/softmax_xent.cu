// Softmax cross-entropy or BCE with label smoothing: one block per row forward, element-wise backward.
#include <cfloat>

#include "cuda/block_reduce.cuh"
#include "cuda/check.h"
#include "cuda/launch.h"
#include "cuda/softmax_xent_kernel.h"

namespace rt::cuda {
namespace {

struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
using Sum = SumOp;

__device__ bool bad_labels(const XentArgs& a, int32_t label, int32_t mixed) {
  return label < 0 || label >= a.k || mixed < 0 || mixed >= a.k;
}

// Marks a row with a label outside [0, k): the lowest such row wins whichever block gets here
// first (unsigned, so that the memset's -1 is the largest value), the same sample named every run.
__device__ void flag_bad_row(const XentArgs& a, int64_t row) {
  atomicMin(reinterpret_cast<unsigned*>(a.bad_row), unsigned(row));
  a.row_loss[row] = 0;
}

// Column col's target (nn/ops.h SoftmaxXentDesc::target); not blended: mixed = label, mix = 1.
__device__ float target_of(const XentArgs& a, int64_t col, int32_t label, int32_t mixed) {
  const float hot = (col == label ? a.mix : 0.0f) + (col == mixed ? 1 - a.mix : 0.0f);
  const float t = (1 - a.label_smoothing) * hot + a.label_smoothing / float(a.k);
  return a.bce && a.bce_threshold >= 0 ? (t > a.bce_threshold ? 1.0f : 0.0f) : t;
}

// Per element softplus(z) - z t with softplus(z) = max(z, 0) + log1p(exp(-|z|)) (no overflow);
// the row's mean over its k classes.
__device__ void bce_row(const XentArgs& a, int64_t row, float* scratch) {
  const float* z = a.logits + row * a.k;
  const int32_t label = a.labels[row], mixed = a.mixed[row];
  const bool bad = bad_labels(a, label, mixed);
  float s = 0;
  for (int64_t j = threadIdx.x; j < a.k; j += blockDim.x) {
    const float e = expf(-fabsf(z[j]));
    a.prob[row * a.k + j] = (z[j] >= 0 ? 1.0f : e) / (1.0f + e);
    s += fmaxf(z[j], 0.0f) + log1pf(e) - z[j] * (bad ? 0.0f : target_of(a, j, label, mixed));
  }
  s = block_reduce(s, Sum{}, 0.0f, scratch);
  if (threadIdx.x != 0) return;
  if (bad) flag_bad_row(a, row);
  else a.row_loss[row] = s / float(a.k);
}

// loss = -(1 - eps) log p[label] - eps / k * sum_j log p[j], with log p = z - lse and
// lse = m + log sum exp(z - m) (m the row max, so exp never overflows).
__global__ void xent_forward_kernel(XentArgs a) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  if (a.bce) return bce_row(a, row, scratch);
  const float* z = a.logits + row * a.k;
  float m = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < a.k; j += blockDim.x) m = fmaxf(m, z[j]);
  m = block_reduce(m, Max{}, -FLT_MAX, scratch);
  float se = 0, sz = 0;
  for (int64_t j = threadIdx.x; j < a.k; j += blockDim.x) {
    se += expf(z[j] - m);
    sz += z[j];
  }
  se = block_reduce(se, Sum{}, 0.0f, scratch);
  sz = block_reduce(sz, Sum{}, 0.0f, scratch);
  const float lse = m + logf(se);
  for (int64_t j = threadIdx.x; j < a.k; j += blockDim.x)
    a.prob[row * a.k + j] = expf(z[j] - lse);
  if (threadIdx.x == 0) {
    const int32_t label = a.labels[row], mixed = a.mixed[row];
    if (bad_labels(a, label, mixed)) return flag_bad_row(a, row);
    const float eps = a.label_smoothing;
    const float sum_logp = sz - float(a.k) * lse;
    const float logp_label = a.mix * (z[label] - lse) + (1 - a.mix) * (z[mixed] - lse);
    a.row_loss[row] = -(1 - eps) * logp_label - eps / float(a.k) * sum_logp;
  }
}

// One block sums the row losses in double in a fixed order: the same mean on every run.
__global__ void mean_kernel(const float* v, int64_t n, double* out) {
  __shared__ double scratch[32];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += double(v[i]);
  s = block_reduce(s, Sum{}, 0.0, scratch);
  if (threadIdx.x == 0) *out = s / double(n);
}

__global__ void xent_backward_kernel(XentArgs a, float* dlogits, float f) {
  const int64_t total = a.n * a.k;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t row = i / a.k, col = i - row * a.k;
    dlogits[i] = (a.prob[i] - target_of(a, col, a.labels[row], a.mixed[row])) * f;
  }
}

}  // namespace

void xent_forward_launch(const XentArgs& a, cudaStream_t stream) {
  if (a.n <= 0 || a.k <= 0 || a.n > INT32_MAX)
    throw Error(str_cat("cuda softmax xent: bad shape ", a.n, " x ", a.k));
  xent_forward_kernel<<<uint32_t(a.n), kThreads, 0, stream>>>(a);
  CUDA_CHECK_LAUNCH();
  mean_kernel<<<1, kThreads, 0, stream>>>(a.row_loss, a.n, a.mean_loss);
  CUDA_CHECK_LAUNCH();
}

void xent_backward_launch(const XentArgs& a, float* dlogits, float scale, cudaStream_t stream) {
  const float f = float(double(scale) / double(a.bce ? a.n * a.k : a.n));
  xent_backward_kernel<<<grid_for(size_t(a.n * a.k)), kThreads, 0, stream>>>(a, dlogits, f);
  CUDA_CHECK_LAUNCH();
}

}  // namespace rt::cuda
