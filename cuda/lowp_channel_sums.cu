// Per-channel sums of the 16-bit backends (NHWC, fp32 results; see lowp_kernels.h): the batch
// norm's statistics and gradient sums, and the other layers' per-channel sums. Two grids: the
// vector grid of lowp_layout.h where the channels are a multiple of kVec and the buffers 16-byte
// aligned (a thread owns kVec channels and loads 16 bytes per row; the batch statistics in one
// pass, by Welford's method), else one channel per thread column (statistics in two passes). Sums
// run in a fixed order per grid (no atomics): the same bits every run.
#include <type_traits>

#include "cuda/block_reduce.cuh"
#include "cuda/check.h"
#include "cuda/lowp_bn.cuh"

namespace rt::cuda {
namespace {

using namespace lowp;

template <ChannelSum K>
constexpr bool kBnGrad = K == ChannelSum::bn_grad || K == ChannelSum::bn_grad_add_relu;

// The per-element terms of the sums: g = dy (masked), and g * xhat, the latter added as
// s + g (x - mean) invstd with each operation rounded on its own: nvcc would fuse a multiply and
// the add where it chooses, and the sums of two kernels (the batch norm's backward and its fusion
// with the residual add's ReLU, on either grid) and the emulator's must round alike.
__device__ inline float grad_xhat_sum(float s, float g, float x, float mean, float invstd) {
  return __fadd_rn(s, __fmul_rn(__fmul_rn(g, x - mean), invstd));
}
template <class T>
__device__ inline float masked_grad(const ChannelSumArgs<T>& a, float x, float dy, float mean,
                                    float scale, float beta) {
  return (a.relu && !bn_passes<T>(bn_value(x, mean, scale, beta))) ? 0.0f : dy;
}

// The block's per-thread results on the vector grid: two values per channel, thread (x, y)'s
// at shared_at(g, y, k) for its channel c0 + k. Threads (x, y < kVec) then combine one channel
// each, so a block has at least kVec rows of threads.
static_assert(kVecBlock / kVecMaxGroups >= kVec);
using VecShared = float[2][kVecBlock * kVec];
__device__ inline int shared_at(const ChannelReduceGeom& g, int y, int k) {
  return (y * g.vec_groups + int(threadIdx.x)) * kVec + k;
}
__device__ inline void share(VecShared& sh, const ChannelReduceGeom& g, const float (&a)[kVec],
                             const float (&b)[kVec]) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    sh[0][shared_at(g, int(threadIdx.y), k)] = a[k];
    sh[1][shared_at(g, int(threadIdx.y), k)] = b[k];
  }
}

// ---- per-channel sums ----

// Block (tile, chunk): threads (tx, ty) walk rows r0 + ty, r0 + ty + kRowThreads, ... of channel
// tile * kChannelTile + tx; the kRowThreads row sums then add in ty order.
template <class T, ChannelSum K>
__global__ void channel_partial_kernel(ChannelSumArgs<T> a, ChannelReduceGeom g) {
  __shared__ float sh1[kRowThreads][kChannelTile];
  __shared__ float sh2[kRowThreads][kChannelTile];
  const int64_t c = int64_t(blockIdx.x) * kChannelTile + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * g.rows_per_chunk;
  const int64_t r1 = r0 + g.rows_per_chunk < g.rows ? r0 + g.rows_per_chunk : g.rows;
  float s1 = 0.0f, s2 = 0.0f;
  if (c < g.channels) {
    const bool mean_used = K == ChannelSum::sq_dev || kBnGrad<K>;
    const bool mask = K == ChannelSum::bn_grad && a.relu;
    const float mean = mean_used ? a.mean[c] : 0.0f;
    const float invstd = kBnGrad<K> ? a.invstd[c] : 0.0f;
    const float scale = mask ? a.scale[c] : 0.0f, beta = mask ? a.beta[c] : 0.0f;
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowThreads) {
      const int64_t i = r * g.channels + c;
      if constexpr (K == ChannelSum::x) {
        s1 += ld(a.x, i);
      } else if constexpr (K == ChannelSum::sq_dev) {
        const float d = ld(a.x, i) - mean;
        s1 += d * d;
      } else if constexpr (K == ChannelSum::dy) {
        s1 += ld(a.dy, i);
      } else if constexpr (K == ChannelSum::bn_grad_add_relu) {
        const T gr = relu_masked(a.out[i], a.dy[i]);  // as lowp_relu_backward
        a.g_out[i] = gr;
        const float gf = to_f32(gr);
        s1 += gf;
        s2 = grad_xhat_sum(s2, gf, ld(a.x, i), mean, invstd);
      } else {
        const float x = ld(a.x, i);
        const float gr = masked_grad(a, x, ld(a.dy, i), mean, scale, beta);
        s1 += gr;
        s2 = grad_xhat_sum(s2, gr, x, mean, invstd);
      }
    }
  }
  sh1[threadIdx.y][threadIdx.x] = s1;
  sh2[threadIdx.y][threadIdx.x] = s2;
  __syncthreads();
  if (threadIdx.y == 0 && c < g.channels) {
    float t1 = 0.0f, t2 = 0.0f;
    for (int k = 0; k < kRowThreads; ++k) {
      t1 += sh1[k][threadIdx.x];
      t2 += sh2[k][threadIdx.x];
    }
    a.partial[int64_t(blockIdx.y) * g.channels + c] = t1;
    a.partial[(g.chunks + int64_t(blockIdx.y)) * g.channels + c] = t2;
  }
}

// The vector grid: block (vec tile, chunk), thread (tx, ty) owns channels [c0, c0 + kVec) of
// group tile * vec_groups + tx and walks rows r0 + ty, r0 + ty + vec_rows, ...; the vec_rows
// row sums then add in ty order, as above. Backward's sums only: the forward's statistics take
// one pass on this grid (bn_stats_vec_kernel).
template <class T, ChannelSum K>
__global__ void channel_partial_vec_kernel(ChannelSumArgs<T> a, ChannelReduceGeom g) {
  static_assert(K == ChannelSum::dy || kBnGrad<K>);
  constexpr bool masks_out = K == ChannelSum::bn_grad_add_relu;
  __shared__ VecShared sh;
  const VecPlace p = vec_place(g);
  const int64_t groups = p.groups, grp = p.grp, c0 = p.c0, r0 = p.r0, r1 = p.r1;
  float s1[kVec] = {}, s2[kVec] = {};
  if (grp < groups) {
    float mean[kVec] = {}, invstd[kVec] = {}, scale[kVec] = {}, beta[kVec] = {};
    if (kBnGrad<K>) {
      load_channels(a.mean, c0, mean);
      load_channels(a.invstd, c0, invstd);
      if (K == ChannelSum::bn_grad && a.relu) {
        load_channels(a.scale, c0, scale);
        load_channels(a.beta, c0, beta);
      }
    }
    uint4 bx[kRowBatch2], bd[kRowBatch2], bo[masks_out ? kRowBatch2 : 1];
    batched_rows<kRowBatch2>(
        r0 + threadIdx.y, r1, g.vec_rows,
        [&](int j, int64_t r) {
          bd[j] = load_raw(a.dy, r * groups + grp);
          if (kBnGrad<K>) bx[j] = load_raw(a.x, r * groups + grp);
          if constexpr (masks_out) bo[j] = load_raw(a.out, r * groups + grp);
        },
        [&](int j, int64_t r) {
          if constexpr (masks_out) {  // g_out may be dy: row r of dy was loaded above
            bd[j] = relu_masked<T>(bo[j], bd[j]);
            reinterpret_cast<uint4*>(a.g_out)[r * groups + grp] = bd[j];
          }
          float x[kVec], dy[kVec];
          widen<T>(bd[j], dy);
          if (kBnGrad<K>) widen<T>(bx[j], x);
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            if constexpr (K == ChannelSum::dy) {
              s1[k] += dy[k];
            } else {
              // masks_out: dy is masked already (a.relu is false then; scale and beta unloaded)
              const float gr = masks_out ? dy[k] : masked_grad(a, x[k], dy[k], mean[k], scale[k], beta[k]);
              s1[k] += gr;
              s2[k] = grad_xhat_sum(s2[k], gr, x[k], mean[k], invstd[k]);
            }
          }
        });
  }
  share(sh, g, s1, s2);
  __syncthreads();
  // Thread (tx, ty < kVec) adds channel c0 + ty's row sums, in ty order.
  if (threadIdx.y < kVec && grp < groups) {
    const int k = int(threadIdx.y);
    float t1 = 0.0f, t2 = 0.0f;
    for (int y = 0; y < g.vec_rows; ++y) {
      t1 += sh[0][shared_at(g, y, k)];
      t2 += sh[1][shared_at(g, y, k)];
    }
    a.partial[int64_t(blockIdx.y) * g.channels + c0 + k] = t1;
    a.partial[(g.chunks + int64_t(blockIdx.y)) * g.channels + c0 + k] = t2;
  }
}

// Parts i of one channel, each of n_i values with mean mu_i and M2_i (sum of squared deviations
// from mu_i), combine exactly (in real arithmetic) into mean = sum n_i mu_i / n and
// M2 = sum M2_i + sum n_i (mu_i - mean)^2: two passes of independent terms, no division inside,
// and none of the cancellation of sum(x^2) - sum(x)^2 / n (each mu_i - mean is small).
// This thread takes parts i = first, first + step, ... < end; reduce adds the threads' terms
// (the identity for a thread alone, a warp's butterfly for its lanes); n(i), mu(i) and m2(i)
// read part i, of total count n_total.
template <class N, class Mu, class M2, class Reduce>
__device__ inline void combine_parts(int64_t first, int64_t end, int64_t step, double n_total,
                                     N n, Mu mu, M2 m2, Reduce reduce, double& mean,
                                     double& m2_total) {
  double s = 0;
  for (int64_t i = first; i < end; i += step) s += n(i) * mu(i);
  mean = reduce(s) / n_total;
  double m = 0;
  for (int64_t i = first; i < end; i += step) {
    const double d = double(mu(i)) - mean;
    m += m2(i) + n(i) * d * d;
  }
  m2_total = reduce(m);
}

// Rows of a chunk that block row y takes: y, y + vec_rows, ... below the chunk's rows.
__device__ inline double rows_of(int64_t chunk_rows, int y, int vec_rows) {
  return double(chunk_rows > y ? (chunk_rows - y + vec_rows - 1) / vec_rows : 0);
}

// The forward's statistics in one pass over x on the vector grid (the element grid takes two:
// the mean, then the squared deviations). Each thread keeps Welford's running mean and M2 of its
// channels over its rows in fp32; thread (tx, ty < kVec) then combines channel c0 + ty's block
// rows, in ty order and in double, into partial[chunk][c] (mean) and partial[chunks + chunk][c]
// (M2).
template <class T>
__global__ void bn_stats_vec_kernel(const T* x, ChannelReduceGeom g, float* partial) {
  __shared__ VecShared sh;
  const VecPlace p = vec_place(g);
  const int64_t groups = p.groups, grp = p.grp, c0 = p.c0, r0 = p.r0, r1 = p.r1;
  float mean[kVec] = {}, m2[kVec] = {};
  if (grp < groups) {
    float n = 0.0f;  // exact: at most rows_per_chunk, far below 2^24
    uint4 bx[kRowBatch];
    batched_rows<kRowBatch>(
        r0 + threadIdx.y, r1, g.vec_rows,
        [&](int j, int64_t r) { bx[j] = load_raw(x, r * groups + grp); },
        [&](int j, int64_t) {
          float e[kVec];
          widen<T>(bx[j], e);
          n += 1.0f;
          const float inv = 1.0f / n;
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            const float d = e[k] - mean[k];
            mean[k] += d * inv;
            m2[k] += d * (e[k] - mean[k]);
          }
        });
  }
  share(sh, g, mean, m2);
  __syncthreads();
  if (threadIdx.y < kVec && grp < groups) {
    const int k = int(threadIdx.y);
    const int64_t chunk_rows = r1 - r0;
    double mu, m;
    combine_parts(
        0, g.vec_rows, 1, double(chunk_rows),
        [&](int64_t y) { return rows_of(chunk_rows, int(y), g.vec_rows); },
        [&](int64_t y) { return sh[0][shared_at(g, int(y), k)]; },
        [&](int64_t y) { return sh[1][shared_at(g, int(y), k)]; }, [](double v) { return v; },
        mu, m);
    partial[int64_t(blockIdx.y) * g.channels + c0 + k] = float(mu);
    partial[(g.chunks + int64_t(blockIdx.y)) * g.channels + c0 + k] = float(m);
  }
}

// The second pass over the chunks, in a fixed order. Where there are many (a narrow layer's large
// tensor), a warp per channel: lane l adds chunks l, l + 32, ... in order, then the lanes' sums
// add in a fixed butterfly, after which every lane holds the same bits. Where there are few
// (wide layers), a thread per channel (Lanes = 1) does it alone.
constexpr int64_t kWarpChunks = 64;  // chunks from which a channel gets a warp
__device__ inline double chunk_rows(const ChannelReduceGeom& g, int64_t k) {
  const int64_t rows = g.rows - k * g.rows_per_chunk;
  return double(rows < g.rows_per_chunk ? rows : g.rows_per_chunk);
}
template <int Lanes>
__device__ inline double lanes_sum(double v) {
  if constexpr (Lanes == 32) v = warp_reduce(v, SumOp{});
  return v;
}
// Channels c, c + stride, ... of this thread's lanes (the same for a warp's lanes when Lanes = 32).
template <int Lanes>
__device__ inline int64_t lanes_channel() {
  return (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / Lanes;
}
template <int Lanes>
__device__ inline int64_t lanes_stride() {
  return int64_t(gridDim.x) * blockDim.x / Lanes;
}
// Calls launch(std::integral_constant<int, Lanes>, blocks) with the lanes per channel g's chunk
// count takes, and the blocks they fill.
template <class Launch>
void launch_totals(const ChannelReduceGeom& g, Launch&& launch) {
  if (g.chunks >= kWarpChunks)
    launch(std::integral_constant<int, 32>{}, blocks_for(g.channels * 32));
  else
    launch(std::integral_constant<int, 1>{}, blocks_for(g.channels));
}

// The chunks' (mean, M2) combined: the mean and the sum of squared deviations, and with
// `stats` (channels > 0) the training statistics from them, as bn_train_stats would after it:
// one small kernel per batch norm fewer.
template <int Lanes>
__global__ void welford_total_kernel(const float* partial, ChannelReduceGeom g, float* mean,
                                     float* var_sum, BnStatsArgs stats) {
  const int lane = int(threadIdx.x % Lanes);
  // A warp's lanes share c: they loop, and shuffle, together.
  for (int64_t c = lanes_channel<Lanes>(); c < g.channels; c += lanes_stride<Lanes>()) {
    double mu, m;
    combine_parts(
        lane, g.chunks, Lanes, double(g.rows), [&](int64_t k) { return chunk_rows(g, k); },
        [&](int64_t k) { return partial[k * g.channels + c]; },
        [&](int64_t k) { return partial[(g.chunks + k) * g.channels + c]; },
        [](double v) { return lanes_sum<Lanes>(v); }, mu, m);
    if (lane == 0) {
      mean[c] = float(mu);
      var_sum[c] = float(m);
      if (stats.channels > 0) train_stats_of(stats, c, float(mu), float(m));
    }
  }
}

template <int Lanes>
__global__ void channel_total_kernel(const float* partial, ChannelReduceGeom g, float* s1,
                                     float* s2) {
  const int lane = int(threadIdx.x % Lanes);
  for (int64_t c = lanes_channel<Lanes>(); c < g.channels; c += lanes_stride<Lanes>()) {
    double t1 = 0, t2 = 0;
    for (int64_t k = lane; k < g.chunks; k += Lanes) {
      t1 += partial[k * g.channels + c];
      t2 += partial[(g.chunks + k) * g.channels + c];
    }
    t1 = lanes_sum<Lanes>(t1);
    t2 = lanes_sum<Lanes>(t2);
    if (lane == 0) {
      s1[c] = float(t1);
      if (s2) s2[c] = float(t2);
    }
  }
}

__global__ void mean_from_sum_kernel(float* mean, int64_t channels, double m) {
  for (int64_t c = first_index(); c < channels; c += grid_stride()) mean[c] = float(mean[c] / m);
}

template <class T, ChannelSum K>
void launch_partial(const ChannelSumArgs<T>& a, const ChannelReduceGeom& g, bool vec,
                    cudaStream_t stream) {
  // grid.y is limited to 65535: channel_reduce_geom keeps chunks at most kMaxChunks.
  if constexpr (K == ChannelSum::dy || kBnGrad<K>)
    if (vec) {
      channel_partial_vec_kernel<T, K><<<vec_grid(g), vec_block(g), 0, stream>>>(a, g);
      CUDA_CHECK_LAUNCH();
      return;
    }
  channel_partial_kernel<T, K><<<dim3(uint32_t(g.tiles), uint32_t(g.chunks)),
                                 dim3(kChannelTile, kRowThreads), 0, stream>>>(a, g);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

template <class T>
void channel_sums(const ChannelSumArgs<T>& a, const ChannelReduceGeom& g, float* s1, float* s2,
                  cudaStream_t stream) {
  if (g.channels <= 0 || g.rows <= 0) return;
  const bool vec = on_vec_grid(g, {a.dy, a.x, a.out, a.g_out});
  switch (a.kind) {
    case ChannelSum::x: launch_partial<T, ChannelSum::x>(a, g, vec, stream); break;
    case ChannelSum::sq_dev: launch_partial<T, ChannelSum::sq_dev>(a, g, vec, stream); break;
    case ChannelSum::dy: launch_partial<T, ChannelSum::dy>(a, g, vec, stream); break;
    case ChannelSum::bn_grad: launch_partial<T, ChannelSum::bn_grad>(a, g, vec, stream); break;
    case ChannelSum::bn_grad_add_relu:
      launch_partial<T, ChannelSum::bn_grad_add_relu>(a, g, vec, stream);
      break;
  }
  launch_totals(g, [&](auto lanes, uint32_t blocks) {
    constexpr int L = decltype(lanes)::value;
    channel_total_kernel<L><<<blocks, kThreads, 0, stream>>>(a.partial, g, s1, s2);
  });
  CUDA_CHECK_LAUNCH();
}

template <class T>
void bn_batch_stats(const T* x, const ChannelReduceGeom& g, float* partial, float* mean,
                    float* var_sum, cudaStream_t stream, const BnStatsArgs* then) {
  if (g.channels <= 0 || g.rows <= 0) return;
  if (on_vec_grid(g, {x})) {
    bn_stats_vec_kernel<T><<<vec_grid(g), vec_block(g), 0, stream>>>(x, g, partial);
    CUDA_CHECK_LAUNCH();
    const BnStatsArgs stats = then ? *then : BnStatsArgs{};
    launch_totals(g, [&](auto lanes, uint32_t blocks) {
      constexpr int L = decltype(lanes)::value;
      welford_total_kernel<L><<<blocks, kThreads, 0, stream>>>(partial, g, mean, var_sum, stats);
    });
    CUDA_CHECK_LAUNCH();
    return;
  }
  ChannelSumArgs<T> a;
  a.x = x;
  a.partial = partial;
  a.kind = ChannelSum::x;
  channel_sums(a, g, mean, nullptr, stream);
  mean_from_sum_kernel<<<blocks_for(g.channels), kThreads, 0, stream>>>(mean, g.channels,
                                                                      double(g.rows));
  CUDA_CHECK_LAUNCH();
  a.kind = ChannelSum::sq_dev;
  a.mean = mean;
  channel_sums(a, g, var_sum, nullptr, stream);
  if (then) bn_train_stats(*then, stream);
}

#define RT_LOWP_SUMS_INSTANTIATE(T)                                                              \
  template void channel_sums(const ChannelSumArgs<T>&, const ChannelReduceGeom&, float*, float*, \
                             cudaStream_t);                                                      \
  template void bn_batch_stats(const T*, const ChannelReduceGeom&, float*, float*, float*,        \
                               cudaStream_t, const BnStatsArgs*);
RT_LOWP_SUMS_INSTANTIATE(bf16)
RT_LOWP_SUMS_INSTANTIATE(f16)
#undef RT_LOWP_SUMS_INSTANTIATE

}  // namespace rt::cuda
