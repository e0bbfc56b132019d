// DeviceArena: reservation, the single allocation, pointer lookup.
#include "cuda/device_arena.h"

namespace rt::cuda {

size_t DeviceArena::reserve(std::string name, size_t bytes, size_t align) {
  if (finalized_)
    throw Error(str_cat("device arena: reserving ", name, " after the arena was allocated"));
  return layout_.add(std::move(name), bytes, align);
}

void DeviceArena::finalize() {
  if (finalized_) throw Error("device arena: finalize called twice");
  buffer_ = DeviceBuffer(layout_.total());
  buffer_.zero();
  finalized_ = true;
}

void* DeviceArena::ptr(size_t id) const {
  if (!finalized_) throw Error("device arena: pointer requested before finalize");
  if (id >= layout_.slots().size())
    throw Error(str_cat("device arena: no region ", id, " (", layout_.slots().size(), " reserved)"));
  return static_cast<char*>(buffer_.get()) + layout_.slots()[id].offset;
}

}  // namespace rt::cuda
