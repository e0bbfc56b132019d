// The emulated CUDA runtime calls (declared by cuda_runtime_api.h, defined here instead of by
// libcudart) and the backend's error reporting, for the kernel sources built by the emulator.
#include "tests/cuda_emu/runtime.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "nn/error.h"

namespace rt_emu {
namespace {

thread_local cudaError_t tl_last_error = cudaSuccess;
std::atomic<int64_t> g_allocations{0};
std::mutex g_mu;
std::unordered_map<void*, size_t>& live() {  // device allocations
  static std::unordered_map<void*, size_t> m;
  return m;
}
std::unordered_map<void*, size_t>& pinned() {  // page-locked host allocations
  static std::unordered_map<void*, size_t> m;
  return m;
}
// Records a new allocation in `table`, or forgets one; false for a pointer it does not hold.
void remember(std::unordered_map<void*, size_t>& table, void* p, size_t bytes) {
  std::lock_guard lock(g_mu);
  table[p] = bytes;
}
bool forget(std::unordered_map<void*, size_t>& table, void* p) {
  std::lock_guard lock(g_mu);
  return table.erase(p) != 0;
}

// An event: when it was last recorded (work is done when queued, so recorded means complete).
struct Event {
  bool recorded = false;
  std::chrono::steady_clock::time_point at;
};
// What p points into: the allocation's type, or none.
cudaMemoryType memory_type(const void* p) {
  std::lock_guard lock(g_mu);
  auto inside = [p](const std::unordered_map<void*, size_t>& m) {
    for (const auto& [base, bytes] : m)
      if (p >= base && static_cast<const char*>(p) < static_cast<const char*>(base) + bytes)
        return true;
    return false;
  };
  if (inside(live())) return cudaMemoryTypeDevice;
  if (inside(pinned())) return cudaMemoryTypeHost;
  return cudaMemoryTypeUnregistered;
}

}  // namespace

void set_last_error(cudaError_t e) { tl_last_error = e; }
int64_t device_allocations() { return g_allocations.load(); }
int64_t device_bytes_live() {
  std::lock_guard lock(g_mu);
  int64_t n = 0;
  for (const auto& [p, bytes] : live()) n += int64_t(bytes);
  return n;
}

}  // namespace rt_emu

extern "C" {

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = rt_emu::tl_last_error;
  rt_emu::tl_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return rt_emu::tl_last_error; }
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    default: return "cudaError (emulated)";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    default: return "unknown error (emulated)";
  }
}

// One emulated device.
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
// Streams are names only: all work runs when queued. A distinct non-null handle per stream.
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = reinterpret_cast<cudaStream_t>(new char);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<char*>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) {
  return e ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = reinterpret_cast<cudaEvent_t>(new rt_emu::Event);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<rt_emu::Event*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  if (!e) return cudaErrorInvalidResourceHandle;
  auto* ev = reinterpret_cast<rt_emu::Event*>(e);
  ev->recorded = true;
  ev->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  return e ? cudaSuccess : cudaErrorInvalidResourceHandle;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  return e ? cudaSuccess : cudaErrorInvalidResourceHandle;
}
// As the device: both events must have been recorded.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  auto* a = reinterpret_cast<rt_emu::Event*>(start);
  auto* b = reinterpret_cast<rt_emu::Event*>(end);
  if (!a || !b || !a->recorded || !b->recorded) return cudaErrorInvalidResourceHandle;
  *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  *a = cudaPointerAttributes{};
  a->type = rt_emu::memory_type(p);
  a->device = 0;
  if (a->type == cudaMemoryTypeDevice) a->devicePointer = const_cast<void*>(p);
  if (a->type == cudaMemoryTypeHost) a->hostPointer = const_cast<void*>(p);
  return cudaSuccess;
}

// Device allocations are exact-size heap blocks (so that AddressSanitizer, where the emulator runs
// under it, sees a kernel's out-of-bounds access), aligned to 256 bytes as cudaMalloc's are and
// filled with kPoison.
cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (posix_memalign(p, 256, bytes ? bytes : 1) != 0) return cudaErrorMemoryAllocation;
  std::memset(*p, rt_emu::kPoison, bytes);
  ++rt_emu::g_allocations;
  rt_emu::remember(rt_emu::live(), *p, bytes);
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  if (!rt_emu::forget(rt_emu::live(), p)) return cudaErrorInvalidValue;
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = std::malloc(bytes ? bytes : 1);
  if (!*p) return cudaErrorMemoryAllocation;
  rt_emu::remember(rt_emu::pinned(), *p, bytes);
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  if (!p) return cudaSuccess;
  if (!rt_emu::forget(rt_emu::pinned(), p)) return cudaErrorInvalidValue;
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  return cudaMemset(p, value, bytes);
}

}  // extern "C"
