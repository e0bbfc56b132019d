// Softmax cross-entropy with label smoothing: one block per row forward, element-wise backward.
#include <cfloat>

#include "cuda/check.h"
#include "cuda/launch.h"
#include "cuda/softmax_xent_kernel.h"

namespace rt::cuda {
namespace {

template <class T, class Op>
__device__ T warp_reduce(T v, Op op) {
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Reduction over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `scratch` holds 32 values and is reused, hence the barriers on both sides.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T identity, T* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_reduce(v, op);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? scratch[lane] : identity;
  return warp_reduce(v, op);
}

struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Sum {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};

// loss = -(1 - eps) log p[label] - eps / k * sum_j log p[j], with log p = z - lse and
// lse = m + log sum exp(z - m) (m the row max, so exp never overflows).
__global__ void xent_forward_kernel(XentArgs a) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
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
    if (label < 0 || label >= a.k || mixed < 0 || mixed >= a.k) {
      // The lowest bad row, whichever block gets here first: the same sample named every run.
      // Unsigned, so that the memset's -1 is the largest value.
      atomicMin(reinterpret_cast<unsigned*>(a.bad_row), unsigned(row));
      a.row_loss[row] = 0;
      return;
    }
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
  const float eps = a.label_smoothing, uniform = eps / float(a.k);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t row = i / a.k, col = i - row * a.k;
    const float hot = (col == a.labels[row] ? a.mix : 0.0f) + (col == a.mixed[row] ? 1 - a.mix : 0.0f);
    const float target = (1 - eps) * hot + uniform;
    dlogits[i] = (a.prob[i] - target) * f;
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
  const float f = float(double(scale) / double(a.n));
  xent_backward_kernel<<<grid_for(size_t(a.n * a.k)), kThreads, 0, stream>>>(a, dlogits, f);
  CUDA_CHECK_LAUNCH();
}

}  // namespace rt::cuda
