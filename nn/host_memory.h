// Host memory a backend copies from without the host waiting (a CUDA backend's page-locked
// pages), for the batches the data loader fills: the loader allocates its buffers there, so the
// next batch's copy to the device overlaps the current step instead of blocking it.
#pragma once
#include <cstddef>
#include <memory>
#include <type_traits>
#include <vector>

namespace rt {

class HostMemory {
 public:
  virtual ~HostMemory() = default;
  virtual void* allocate(size_t bytes) = 0;  // throws on failure
  virtual void deallocate(void* p, size_t bytes) noexcept = 0;
};

// A std::vector allocator that names the HostMemory its bytes live in (nullptr: the heap). It
// travels with the bytes on swap and move, so batches swapped between a loader and its caller
// stay where they were allocated and are freed there, whoever ends up holding them.
template <class T>
class HostAllocator {
 public:
  using value_type = T;
  using propagate_on_container_swap = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_copy_assignment = std::true_type;
  using is_always_equal = std::false_type;

  HostAllocator() = default;
  explicit HostAllocator(HostMemory* m) : m_(m) {}
  template <class U>
  HostAllocator(const HostAllocator<U>& o) : m_(o.memory()) {}

  T* allocate(size_t n) {
    return m_ ? static_cast<T*>(m_->allocate(n * sizeof(T))) : std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (m_) m_->deallocate(p, n * sizeof(T));
    else std::allocator<T>().deallocate(p, n);
  }
  HostMemory* memory() const { return m_; }
  friend bool operator==(const HostAllocator& a, const HostAllocator& b) { return a.m_ == b.m_; }

 private:
  HostMemory* m_ = nullptr;
};

template <class T>
using HostVector = std::vector<T, HostAllocator<T>>;

// v emptied and moved to memory m (no copy of its contents) unless it is there already.
template <class T>
void rehome(HostVector<T>& v, HostMemory* m) {
  if (v.get_allocator().memory() != m) v = HostVector<T>(HostAllocator<T>(m));
}

}  // namespace rt
