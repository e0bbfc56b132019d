// Placement of named regions in one device allocation (parameters, gradients, momentum,
// workspaces): plain host arithmetic, tested without a GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "nn/error.h"

namespace rt::cuda {

// cudaMalloc's own guarantee; enough for 16-byte vector access and for cuDNN and cuBLAS, which
// want 128- or 256-byte aligned operands for their fastest paths.
constexpr size_t kArenaAlign = 256;

struct ArenaSlot {
  std::string name;
  size_t offset = 0;  // bytes from the arena's start, a multiple of the slot's alignment
  size_t bytes = 0;
};

class ArenaLayout {
 public:
  // Places a region after the previous ones; returns its index. align: a power of two that
  // divides kArenaAlign (the base's alignment). Throws rt::Error on a bad alignment or if the
  // total would overflow size_t.
  size_t add(std::string name, size_t bytes, size_t align = kArenaAlign) {
    if (align == 0 || (align & (align - 1)) != 0 || kArenaAlign % align != 0)
      throw Error(str_cat("device arena: alignment ", align, " of ", name,
                          " must be a power of two dividing ", kArenaAlign));
    const size_t offset = (end_ + align - 1) / align * align;
    if (offset < end_ || bytes > SIZE_MAX - offset)
      throw Error(str_cat("device arena: ", name, " (", bytes, " bytes) overflows the arena"));
    slots_.push_back({std::move(name), offset, bytes});
    end_ = offset + bytes;
    return slots_.size() - 1;
  }
  // Bytes the single allocation needs (the end of the last region).
  size_t total() const { return end_; }
  const std::vector<ArenaSlot>& slots() const { return slots_; }

 private:
  std::vector<ArenaSlot> slots_;
  size_t end_ = 0;
};

}  // namespace rt::cuda
