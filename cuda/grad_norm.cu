// The gradients' sum of squares behind train.clip_grad_norm (Backend::sum_squares): a warp per
// chunk of kSquaresChunk elements in the host's order (nn/ops.h), each chunk's sum written in
// double for the host to add up in order.
#include "cuda/block_reduce.cuh"
#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/launch.h"
#include "cuda/lars.h"  // lars_add, lars_mul: double arithmetic, rounded as on the host

namespace rt::cuda {
namespace {

// Lane l sums elements l, l + 32, ... of its warp's chunk (neighbouring lanes read neighbouring
// elements), then the butterfly adds lane l + 16 to lane l, + 8, + 4, + 2, + 1: the host's
// warp_order_squares (nn/optimizer.h) step by step.
__global__ void chunk_squares_kernel(const float* __restrict__ v, uint64_t n, uint64_t chunks,
                                     uint32_t chunk, double* __restrict__ sums) {
  const uint64_t c = (uint64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLarsLanes;
  const uint32_t lane = threadIdx.x % kLarsLanes;
  if (c >= chunks) return;  // the whole warp: blockDim.x is a multiple of 32
  const uint64_t begin = c * chunk;
  const uint64_t len = n - begin < chunk ? n - begin : chunk;
  double s = 0;
  for (uint64_t i = lane; i < len; i += kLarsLanes) {
    const double x = v[begin + i];
    s = lars_add(s, lars_mul(x, x));
  }
  s = warp_reduce(s, LarsAdd{});
  if (lane == 0) sums[c] = s;
}

}  // namespace

void chunk_squares(const float* v, size_t n, uint32_t chunk, double* sums, cudaStream_t stream) {
  if (n == 0) return;
  const uint64_t chunks = (n + chunk - 1) / chunk;
  constexpr uint64_t kPerBlock = kThreads / kLarsLanes;
  static_assert(kThreads % kLarsLanes == 0, "whole warps per block");
  const uint64_t blocks = (chunks + kPerBlock - 1) / kPerBlock;
  if (blocks >= (uint64_t{1} << 31))  // 2^40 elements: never, but cheap to be right
    throw Error(str_cat("cuda chunk_squares: ", n, " elements need more blocks than a grid holds"));
  chunk_squares_kernel<<<uint32_t(blocks), kThreads, 0, stream>>>(v, n, chunks, chunk, sums);
  CUDA_CHECK_LAUNCH();
}

}  // namespace rt::cuda
