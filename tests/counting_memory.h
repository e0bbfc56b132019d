// A HostMemory that counts and remembers its blocks, standing in for a GPU's page-locked pages
// in tests of where batches are allocated.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include "nn/host_memory.h"

namespace rt::test {

class CountingMemory final : public HostMemory {
 public:
  void* allocate(size_t bytes) override {
    void* p = ::operator new(bytes);
    std::lock_guard<std::mutex> lock(mu_);  // loader threads allocate too
    blocks_[p] = bytes;
    ++allocs_;
    return p;
  }
  void deallocate(void* p, size_t bytes) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(p);
    if (it == blocks_.end() || it->second != bytes) std::abort();  // freed here but not ours
    blocks_.erase(it);
    ::operator delete(p);
  }
  // Whether [p, p + bytes) lies in one live block.
  bool owns(const void* p, size_t bytes) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.upper_bound(const_cast<void*>(p));
    if (it == blocks_.begin()) return false;
    --it;
    const auto* b = static_cast<const char*>(it->first);
    return static_cast<const char*>(p) >= b && static_cast<const char*>(p) + bytes <= b + it->second;
  }
  int64_t allocs() const {
    std::lock_guard<std::mutex> lock(mu_);
    return allocs_;
  }
  size_t live() const {
    std::lock_guard<std::mutex> lock(mu_);
    return blocks_.size();
  }

 private:
  mutable std::mutex mu_;
  std::map<void*, size_t> blocks_;
  int64_t allocs_ = 0;
};

}  // namespace rt::test
