// Reductions over a warp and over a block, in a fixed order (the same bits every run).
#pragma once

namespace rt::cuda {

template <class T, class Op>
__device__ T warp_reduce(T v, Op op) {
#pragma unroll
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

struct SumOp {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};

}  // namespace rt::cuda
