// Launch arithmetic of the element-wise kernels, in plain C++ so that the host tests check it with
// no GPU and no CUDA headers: launch splitting for huge counts, grid sizes, vector widths, tails.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

// Host and device: the index logic below runs in the kernels and in the host tests alike.
#ifdef __CUDACC__
#define RT_HOST_DEVICE __host__ __device__
#else
#define RT_HOST_DEVICE
#endif

namespace rt::cuda {

constexpr int kThreads = 256;  // threads per block of every element-wise kernel
// Grid cap for grid-stride loops: enough blocks to fill any current GPU (H200: 132 SMs x 16
// resident blocks of 256 threads is 2112) without launching millions of tiny blocks.
constexpr uint32_t kMaxBlocks = 4096;
// Elements one launch covers at most. Kernels index with 32-bit unsigned integers, so a launch
// must keep index + grid stride below 2^32; 2^30 leaves room and is a multiple of every vector
// width, so every launch after the first starts as aligned as the first.
constexpr size_t kMaxLaunchElems = size_t{1} << 30;
// Bytes one vector load or store moves (uint4 / float4).
constexpr size_t kVecBytes = 16;

struct LaunchRange {
  size_t offset = 0;  // first element of this launch
  size_t count = 0;   // elements in it (1 .. max_elems)
  bool operator==(const LaunchRange& o) const { return offset == o.offset && count == o.count; }
};

// Splits [0, n) into consecutive launches of at most max_elems elements (none for n = 0).
inline std::vector<LaunchRange> split_launches(size_t n, size_t max_elems = kMaxLaunchElems) {
  std::vector<LaunchRange> out;
  if (max_elems == 0) return out;
  out.reserve(n / max_elems + 1);
  for (size_t off = 0; off < n; off += std::min(max_elems, n - off))
    out.push_back({off, std::min(max_elems, n - off)});
  return out;
}

// Blocks for `items` work items of `threads` each, capped for grid-stride loops; at least 1 so
// that a launch for an empty tail is still a valid configuration.
inline uint32_t grid_for(size_t items, int threads = kThreads, uint32_t max_blocks = kMaxBlocks) {
  const size_t blocks = (items + size_t(threads) - 1) / size_t(threads);
  return uint32_t(std::clamp<size_t>(blocks, 1, max_blocks));
}

// Elements per vector access: kVecBytes / elem_size when every pointer is aligned to kVecBytes,
// else 1 (scalar). Buffers sliced at odd offsets (ring chunks of any count) take the scalar path.
inline int vec_width(size_t elem_size, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % kVecBytes != 0) return 1;
  return int(kVecBytes / elem_size);
}

// Whether n elements of elem_size at these pointers go entirely as 16-byte vectors: every pointer
// aligned and no tail (the layer kernels' vector paths, which have no scalar tail).
inline bool whole_vectors(size_t n, size_t elem_size, std::initializer_list<const void*> ptrs) {
  return n % (kVecBytes / elem_size) == 0 && vec_width(elem_size, ptrs) > 1;
}

// n elements as whole vectors of `width` followed by a scalar tail.
struct VecSplit {
  size_t vectors = 0;  // full vectors
  size_t tail = 0;     // elements after them (< width)
};
inline VecSplit vec_split(size_t n, int width) {
  return {n / size_t(width), n % size_t(width)};
}

// The work of global thread `first` (of `stride` threads in the grid) in one launch over n
// elements split as `vectors` vectors of `width` plus a tail: vec(v) for its vectors (grid-stride),
// then scalar(i) for at most one tail element (the tail is shorter than a vector, the grid has
// at least kThreads threads). map_kernel runs exactly this; the host tests check that every
// element is visited exactly once.
template <class Vec, class Scalar>
RT_HOST_DEVICE inline void map_thread(uint32_t first, uint32_t stride, uint32_t vectors,
                                      uint32_t width, uint32_t n, Vec&& vec, Scalar&& scalar) {
  for (uint32_t v = first; v < vectors; v += stride) vec(v);
  const uint32_t t = vectors * width + first;
  if (width > 1 && t < n) scalar(t);
}

}  // namespace rt::cuda
