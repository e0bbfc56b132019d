// Counted device and pinned allocations.
#include "cuda/memory.h"

#include <atomic>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "cuda/check.h"

namespace rt::cuda {
namespace {

struct Counters {
  std::atomic<int64_t> device_allocs{0}, device_frees{0}, pinned_allocs{0}, pinned_frees{0},
      device_bytes{0}, pinned_bytes{0};
};
Counters& counters() {
  static Counters c;
  return c;
}

void check_range(const char* what, size_t n, size_t offset, size_t bytes) {
  if (offset > bytes || n > bytes - offset)
    throw Error(str_cat("cuda DeviceBuffer::", what, ": ", n, " bytes at offset ", offset,
                        " exceed the buffer's ", bytes));
}

}  // namespace

AllocStats alloc_stats() {
  Counters& c = counters();
  return {c.device_allocs.load(), c.device_frees.load(), c.pinned_allocs.load(),
          c.pinned_frees.load(),  c.device_bytes.load(), c.pinned_bytes.load()};
}

bool is_page_locked(const void* p) {
  cudaPointerAttributes a{};
  CUDA_CHECK(cudaPointerGetAttributes(&a, p));
  return a.type == cudaMemoryTypeHost;
}

namespace {
// About 3 significant digits in the largest binary unit that keeps the number at least 1.
std::string human(size_t bytes) {
  const char* unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  for (; v >= 1024 && u < 4; ++u) v /= 1024;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 || v >= 100 ? "%.0f %s" : v >= 10 ? "%.1f %s" : "%.2f %s", v,
                unit[u]);
  return buf;
}
}  // namespace

void* device_malloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it for later checks
    std::string what = str_cat("cudaMalloc of ", bytes, " bytes failed: ", cudaGetErrorString(e));
    if (e != cudaErrorMemoryAllocation) throw Error(what);
    // What a user needs to size the job: the device's state, and how much of it is ours.
    int device = -1;
    size_t free = 0, total = 0;
    if (cudaGetDevice(&device) == cudaSuccess && cudaMemGetInfo(&free, &total) == cudaSuccess)
      what += str_cat(" (", human(bytes), "; device ", device, " has ", human(free), " free of ",
                      human(total), ", ", human(size_t(counters().device_bytes.load())),
                      " held by this process's ringtrain buffers)");
    cudaGetLastError();
    throw OutOfMemory(what);
  }
  ++counters().device_allocs;
  counters().device_bytes += int64_t(bytes);
  return p;
}

namespace {
cudaError_t free_counted(void* p, size_t bytes) noexcept {
  const cudaError_t e = cudaFree(p);
  if (e == cudaSuccess) {
    ++counters().device_frees;
    counters().device_bytes -= int64_t(bytes);
  }
  return e;
}
}  // namespace

void device_free(void* p, size_t bytes) {
  if (p) CUDA_CHECK(free_counted(p, bytes));
}

void* pinned_malloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    const std::string what = str_cat("cudaMallocHost of ", bytes, " bytes failed: ", cudaGetErrorString(e));
    if (e == cudaErrorMemoryAllocation) throw OutOfMemory(what + " (page-locked host memory)");
    throw Error(what);
  }
  ++counters().pinned_allocs;
  counters().pinned_bytes += int64_t(bytes);
  return p;
}

void pinned_free(void* p, size_t bytes) {
  if (!p) return;
  CUDA_CHECK(cudaFreeHost(p));
  ++counters().pinned_frees;
  counters().pinned_bytes -= int64_t(bytes);
}

void bind_device(int device) {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess || d != device) CUDA_CHECK(cudaSetDevice(device));
}

HostMemory& pinned_memory(int device) {
  // Page-locked memory is so for every device (unified addressing), but a loader thread of a rank
  // on device 3 binds device 3 first (bind_device).
  class Pinned final : public HostMemory {
   public:
    explicit Pinned(int device) : device_(device) {}
    void* allocate(size_t bytes) override {
      bind();
      return pinned_malloc(bytes);
    }
    void deallocate(void* p, size_t bytes) noexcept override {
      try {
        bind();
        pinned_free(p, bytes);
      } catch (const std::exception& e) {  // from a destructor: reported, not thrown
        std::fprintf(stderr, "warning: %s\n", e.what());
      }
    }

   private:
    void bind() const { bind_device(device_); }
    int device_;
  };
  static std::mutex mu;
  static std::map<int, std::unique_ptr<Pinned>> all;  // never erased: the addresses stay valid
  std::lock_guard<std::mutex> lock(mu);
  auto& p = all[device];
  if (!p) p = std::make_unique<Pinned>(device);
  return *p;
}

void finish_legacy_stream() { CUDA_CHECK(cudaStreamSynchronize(nullptr)); }

void DeviceBuffer::upload(const void* host, size_t n, size_t offset) {
  check_range("upload", n, offset, bytes_);
  if (!n) return;
  CUDA_CHECK(cudaMemcpy(static_cast<char*>(p_) + offset, host, n, cudaMemcpyHostToDevice));
  finish_legacy_stream();
}

void DeviceBuffer::download(void* host, size_t n, size_t offset) const {
  check_range("download", n, offset, bytes_);
  if (n)
    CUDA_CHECK(cudaMemcpy(host, static_cast<const char*>(p_) + offset, n, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::zero() {
  if (!bytes_) return;
  CUDA_CHECK(cudaMemset(p_, 0, bytes_));
  finish_legacy_stream();
}

// A destructor must not throw: a failed free (a dead context at exit) is dropped.
void DeviceBuffer::reset() {
  if (p_) free_counted(p_, bytes_);
  p_ = nullptr;
  bytes_ = 0;
}

}  // namespace rt::cuda
