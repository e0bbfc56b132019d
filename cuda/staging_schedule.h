// The chunk schedule of pinned-memory staging (device <-> host copies pipelined with the host's
// use of each chunk, for an MPI that cannot read device memory): plain host arithmetic.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "nn/error.h"

namespace rt::cuda {

struct StagingChunk {
  size_t offset = 0;     // bytes into the device buffer
  size_t bytes = 0;      // 1 .. chunk size
  int slot = 0;          // pinned buffer it goes through: chunk k uses slot k % slots
  int64_t reuses = -1;   // the earlier chunk that used the same slot (must be finished), or -1
};

// Chunks of `chunk_bytes` (the last one shorter) over `bytes`, round-robin over `slots` pinned
// buffers. None for bytes = 0. Throws rt::Error for chunk_bytes = 0 or slots < 1.
inline std::vector<StagingChunk> staging_schedule(size_t bytes, size_t chunk_bytes, int slots) {
  if (chunk_bytes == 0 || slots < 1)
    throw Error(str_cat("staging: need a chunk size > 0 and at least one slot, got ", chunk_bytes,
                        " bytes and ", slots, " slots"));
  std::vector<StagingChunk> out;
  out.reserve(bytes / chunk_bytes + 1);
  for (size_t off = 0; off < bytes; off += chunk_bytes) {
    const int64_t k = int64_t(out.size());
    const size_t n = bytes - off < chunk_bytes ? bytes - off : chunk_bytes;
    out.push_back({off, n, int(k % slots), k >= slots ? k - slots : -1});
  }
  return out;
}

}  // namespace rt::cuda
