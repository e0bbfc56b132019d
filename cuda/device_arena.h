// One cudaMalloc for everything a training step touches that outlives a layer call: regions are
// reserved at set-up, the arena is allocated once, and the step only takes pointers into it.
#pragma once
#include <string>

#include "cuda/arena_layout.h"
#include "cuda/memory.h"

namespace rt::cuda {

class DeviceArena {
 public:
  // Reserves a region (before finalize); returns its id. Throws rt::Error after finalize.
  size_t reserve(std::string name, size_t bytes, size_t align = kArenaAlign);
  // Allocates the arena (one device_malloc, zeroed). Throws rt::Error if called twice.
  void finalize();
  bool finalized() const { return finalized_; }

  // Device pointer of region id (after finalize; throws rt::Error before, or for a bad id).
  void* ptr(size_t id) const;
  template <class T> T* as(size_t id) const { return static_cast<T*>(ptr(id)); }
  const ArenaSlot& slot(size_t id) const { return layout_.slots().at(id); }
  size_t bytes() const { return layout_.total(); }

 private:
  ArenaLayout layout_;
  DeviceBuffer buffer_;
  bool finalized_ = false;
};

}  // namespace rt::cuda
