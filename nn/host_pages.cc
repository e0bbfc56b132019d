// Buffer's host memory. A big block comes straight from the kernel, whose fresh pages read as
// zero and cost nothing until touched: zeroing it here would fault in every page at once, which
// for the buffers a run sizes generously (scratch grown op by op, gradients an evaluation never
// writes) is most of a process's start-up time and resident memory.
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "nn/tensor.h"

namespace rt::detail {
namespace {

// Under AddressSanitizer every block goes through the heap, where its bounds are checked.
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kMapBytes = ~size_t(0);
#else
constexpr size_t kMapBytes = size_t(1) << 20;  // glibc maps blocks of this size itself anyway
#endif

}  // namespace

void* host_alloc_zeroed(size_t bytes) {
  if (bytes >= kMapBytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return p;
  }
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  return p;
}

void host_free(void* p, size_t bytes) noexcept {
  if (!p) return;
  if (bytes >= kMapBytes) ::munmap(p, bytes);
  else std::free(p);
}

}  // namespace rt::detail
