// The emulated CUDA runtime calls (declared by cuda_runtime_api.h, defined here instead of by
// libcudart) and the backend's error reporting, for the kernel sources built by the emulator.
#include "tests/cuda_emu/runtime.h"

#include <atomic>
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
std::unordered_map<void*, size_t>& live() {
  static std::unordered_map<void*, size_t> m;
  return m;
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

namespace rt::cuda {
[[noreturn]] void throw_cuda_error(const char* file, int line, const char* call, cudaError_t e) {
  throw Error(str_cat(file, ":", line, ": ", call, " failed: ", cudaGetErrorString(e)));
}
}  // namespace rt::cuda

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
    default: return "cudaError (emulated)";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidValue: return "invalid argument";
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
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<char*>(s);
  return cudaSuccess;
}

// Device allocations are exact-size heap blocks (so that AddressSanitizer, where the emulator runs
// under it, sees a kernel's out-of-bounds access), filled with kPoison.
cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = std::malloc(bytes ? bytes : 1);
  if (!*p) return cudaErrorMemoryAllocation;
  std::memset(*p, rt_emu::kPoison, bytes);
  ++rt_emu::g_allocations;
  std::lock_guard lock(rt_emu::g_mu);
  rt_emu::live()[*p] = bytes;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  {
    std::lock_guard lock(rt_emu::g_mu);
    if (rt_emu::live().erase(p) == 0) return cudaErrorInvalidValue;
  }
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = std::malloc(bytes ? bytes : 1);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* p) {
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
