// Index arithmetic of the 16-bit backends (cuda-bf16, cuda-fp16), in plain C++ so that the host
// tests check it with no GPU: activation sizes in float units, NCHW/NHWC and OIHW/OHWI index
// maps and the per-channel reduction's grid. Both types are two bytes, so all of it is shared.
// C++17-clean (nvcc includes it). Host rounding to either type is in nn/tensor.h.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda/launch.h"  // RT_HOST_DEVICE

namespace rt::cuda {

// Backend<float>::act_size counts floats, but the 16-bit backends store two values per float:
// ceil(numel / 2) floats, rounded up to whole 16-byte vectors (4 floats, 8 values) so that every
// activation buffer the Net carves can be read with vector loads to its end.
inline size_t lowp_act_floats(int64_t numel) {
  if (numel <= 0) return 0;
  const size_t vectors = (size_t(numel) + 7) / 8;  // 8 two-byte values per 16 bytes
  return vectors * 4;
}

// Element (n, c, h, w) of a logical (N, C, H, W) tensor in each layout.
RT_HOST_DEVICE inline int64_t nchw_index(int64_t n, int64_t c, int64_t h, int64_t w, int64_t C,
                                         int64_t H, int64_t W) {
  return ((n * C + c) * H + h) * W + w;
}
RT_HOST_DEVICE inline int64_t nhwc_index(int64_t n, int64_t c, int64_t h, int64_t w, int64_t C,
                                         int64_t H, int64_t W) {
  return ((n * H + h) * W + w) * C + c;
}

// A weight of canonical layout OIHW ([out][in][kh][kw]; a linear layer's [out][C][H][W]) and its
// private copy in OHWI (cuDNN's KRSC for NHWC filters; for a linear layer on an NHWC input, the
// order of the input's own elements). The same map serves convolutions and linear layers.
struct WeightGeom {
  int64_t o = 0, i = 0, h = 1, w = 1;
  RT_HOST_DEVICE int64_t count() const { return o * i * h * w; }
};
// OHWI offset of the element at OIHW offset `oihw`.
RT_HOST_DEVICE inline int64_t ohwi_from_oihw(int64_t oihw, const WeightGeom& g) {
  const int64_t kw = oihw % g.w, kh = (oihw / g.w) % g.h, ci = (oihw / (g.w * g.h)) % g.i,
                co = oihw / (g.w * g.h * g.i);
  return ((co * g.h + kh) * g.w + kw) * g.i + ci;
}

// Per-channel sums over the rows (N*H*W) of an NHWC tensor, deterministically: blocks of
// kChannelTile channels x kRowThreads rows; block (tile, chunk) sums rows [chunk * rows_per_chunk,
// +rows_per_chunk) of its channels into partial[chunk][c]; a second pass (a warp per channel
// where they are many) adds the chunks of each channel in a fixed order. There are enough chunks
// for about kTargetBlocks blocks (a few per multiprocessor of a large GPU, the same on every GPU, so the
// same bits), at least kMinRowsPerChunk rows each, and at most kMaxChunks.
//
// Where the channels are a multiple of kVec (8 two-byte values, 16 bytes) and the buffers are
// 16-byte aligned (every ResNet layer but the input), the batch-norm kernels take the vector
// grid instead: a thread owns one group of kVec neighbouring channels, loads 16 bytes per row and
// keeps its channels' parameters in registers; a block is vec_groups groups x vec_rows rows
// (at most kVecBlock threads: narrow layers walk more rows at once, so that a warp still reads
// whole 128-byte lines), and block (vec tile, chunk) covers the same rows as above.
constexpr int kChannelTile = 32;  // channels per block: one warp reads 32 neighbouring channels
constexpr int kRowThreads = 8;    // rows a block walks at once
constexpr int64_t kTargetBlocks = 1024;
constexpr int64_t kMaxChunks = 1024;
constexpr int64_t kMinRowsPerChunk = 64;
constexpr int kVec = 8;
constexpr int kVecBlock = 256;
constexpr int kVecMaxGroups = 32;  // groups per block: 256 channels

struct ChannelReduceGeom {
  int64_t rows = 0, channels = 0;
  int64_t rows_per_chunk = 0;
  int64_t chunks = 0;       // grid.y
  int64_t tiles = 0;        // grid.x = ceil(channels / kChannelTile)
  // The vector grid, where channels % kVec == 0 (else vec_tiles = 0).
  int vec_groups = 0, vec_rows = 0;  // block (x, y)
  int64_t vec_tiles = 0;             // grid.x = ceil(channels / kVec / vec_groups)
};
inline ChannelReduceGeom channel_reduce_geom(int64_t rows, int64_t channels) {
  ChannelReduceGeom g;
  g.rows = rows;
  g.channels = channels;
  if (rows <= 0 || channels <= 0) return g;
  g.tiles = (channels + kChannelTile - 1) / kChannelTile;
  if (channels % kVec == 0) {
    const int64_t groups = channels / kVec;
    g.vec_groups = int(groups < kVecMaxGroups ? groups : kVecMaxGroups);
    g.vec_rows = kVecBlock / g.vec_groups;
    g.vec_tiles = (groups + g.vec_groups - 1) / g.vec_groups;
  }
  const int64_t across = g.vec_tiles > 0 ? g.vec_tiles : g.tiles;
  int64_t want = (kTargetBlocks + across - 1) / across;
  if (want > kMaxChunks) want = kMaxChunks;
  const int64_t even = (rows + want - 1) / want;
  g.rows_per_chunk = even > kMinRowsPerChunk ? even : kMinRowsPerChunk;
  g.chunks = (rows + g.rows_per_chunk - 1) / g.rows_per_chunk;
  return g;
}

}  // namespace rt::cuda
