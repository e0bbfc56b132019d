// The emulated CUDA runtime calls (declared by cuda_runtime_api.h, defined here instead of by
// libcudart) and the backend's error reporting, for the kernel sources built by the emulator.
#include "tests/cuda_emu/runtime.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "nn/error.h"
#include "tests/cuda_emu/streams.h"

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
std::unordered_map<void*, size_t>& managed() {  // cudaMallocManaged's
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
  if (inside(managed())) return cudaMemoryTypeManaged;
  if (inside(pinned())) return cudaMemoryTypeHost;
  return cudaMemoryTypeUnregistered;
}

// A copy on stream s, each end classified once. It returns only once done where CUDA's does
// (`blocking_call`: cudaMemcpy, except between device buffers and from pageable memory to the
// device, whose DMA "may not have completed" on return; any call into pageable memory or between
// host buffers); otherwise it is queued. Pageable memory is read at the call (CUDA stages it
// then, so the caller may reuse it at once).
cudaError_t copy(void* dst, const void* src, size_t bytes, cudaStream_t s, bool blocking_call) {
  if (!bytes) return cudaSuccess;
  const cudaMemoryType from = memory_type(src), to = memory_type(dst);
  const bool device_to_device = from == cudaMemoryTypeDevice && to == cudaMemoryTypeDevice;
  const bool host_to_host = from != cudaMemoryTypeDevice && to != cudaMemoryTypeDevice;
  Work w;
  if (from == cudaMemoryTypeUnregistered) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    w = [=] { std::memcpy(dst, staged->data(), bytes); };
  } else {
    w = [=] { std::memmove(dst, src, bytes); };
  }
  const bool pageable_upload = from == cudaMemoryTypeUnregistered && to == cudaMemoryTypeDevice;
  if ((blocking_call && !device_to_device && !pageable_upload) || host_to_host ||
      to == cudaMemoryTypeUnregistered)
    run_in_order(s, std::move(w));
  else
    enqueue(s, std::move(w));
  return cudaSuccess;
}

}  // namespace

void set_last_error(cudaError_t e) { tl_last_error = e; }
std::atomic<cudaError_t> g_fault{cudaSuccess};
void set_device_fault(cudaError_t e) { g_fault.store(e); }
cudaError_t device_fault() { return g_fault.load(); }
// A query's "not ready" kept as the thread's last error, as the runtime may keep it (PyTorch
// clears it after each query): code that queries must clear it before a launch check, or that
// check blames the next kernel.
cudaError_t recorded(cudaError_t e) {
  if (e != cudaSuccess) tl_last_error = e;
  return e;
}
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
  if (const cudaError_t f = rt_emu::device_fault(); f != cudaSuccess) return f;  // sticky
  const cudaError_t e = rt_emu::tl_last_error;
  rt_emu::tl_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) {
  if (const cudaError_t f = rt_emu::device_fault(); f != cudaSuccess) return f;
  return rt_emu::tl_last_error;
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
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
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
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
// Each process emulates a device of its own, so its bus id names the process (ranks of an mpirun
// have a GPU each, as NCCL needs); RT_EMU_PCI_BUS_ID gives every process one id instead (ranks
// sharing a GPU).
cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  if (!id || len <= 0) return cudaErrorInvalidValue;
  const char* shared = std::getenv("RT_EMU_PCI_BUS_ID");
  if (shared && *shared)
    std::snprintf(id, size_t(len), "%s", shared);
  else
    std::snprintf(id, size_t(len), "%08x:01:00.0", unsigned(getpid()));
  return cudaSuccess;
}
// A 64 GiB device, or RT_EMU_DEVICE_MIB MiB, whose memory in use is what the program holds (for
// bench_gpu_step's figures); cudaMalloc refuses what does not fit (tests of the out-of-memory path).
static size_t device_size() {
  static const size_t bytes = [] {
    const char* mib = std::getenv("RT_EMU_DEVICE_MIB");
    return mib && *mib ? size_t(std::strtoull(mib, nullptr, 10)) << 20 : size_t(64) << 30;
  }();
  return bytes;
}
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  *total = device_size();
  *free = *total - size_t(rt_emu::device_bytes_live());
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;  // the headers it was built with
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "emulated device");
  prop->major = 9;  // as the sm_90 the real build targets
  prop->totalGlobalMem = device_size();
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  rt_emu::device_synchronize();
  return rt_emu::device_fault();
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  const cudaError_t e = rt_emu::stream_synchronize(s);
  return rt_emu::device_fault() != cudaSuccess ? rt_emu::device_fault() : e;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return rt_emu::stream_create(s, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  return rt_emu::stream_create(s, flags);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) { return rt_emu::stream_destroy(s); }
cudaError_t cudaStreamQuery(cudaStream_t s) {
  if (const cudaError_t f = rt_emu::device_fault(); f != cudaSuccess) return f;
  return rt_emu::recorded(rt_emu::stream_query(s));
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  return rt_emu::stream_wait_event(s, e);
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return rt_emu::event_create(e, cudaEventDefault); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  return rt_emu::event_create(e, flags);
}
cudaError_t cudaEventDestroy(cudaEvent_t e) { return rt_emu::event_destroy(e); }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { return rt_emu::event_record(e, s); }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return rt_emu::event_synchronize(e); }
cudaError_t cudaEventQuery(cudaEvent_t e) { return rt_emu::recorded(rt_emu::event_query(e)); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  return rt_emu::recorded(rt_emu::event_elapsed_ms(ms, start, end));
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
static bool poisoned_block(void** p, size_t bytes) {
  if (posix_memalign(p, 256, bytes ? bytes : 1) != 0) return false;
  std::memset(*p, rt_emu::kPoison, bytes);
  return true;
}
cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (bytes > device_size() - size_t(rt_emu::device_bytes_live()) || !poisoned_block(p, bytes))
    return cudaErrorMemoryAllocation;
  ++rt_emu::g_allocations;
  rt_emu::remember(rt_emu::live(), *p, bytes);
  return cudaSuccess;
}
// As CUDA's, frees wait for all queued work, which may still use the memory.
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  rt_emu::device_synchronize();
  if (!rt_emu::forget(rt_emu::live(), p) && !rt_emu::forget(rt_emu::managed(), p))
    return cudaErrorInvalidValue;
  std::free(p);
  return cudaSuccess;
}
// Managed memory: host and device alike read it at any time, so copies and fills treat it as host
// memory (they complete before returning).
cudaError_t cudaMallocManaged(void** p, size_t bytes, unsigned) {
  if (!poisoned_block(p, bytes)) return cudaErrorMemoryAllocation;
  rt_emu::remember(rt_emu::managed(), *p, bytes);
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
  rt_emu::device_synchronize();
  if (!rt_emu::forget(rt_emu::pinned(), p)) return cudaErrorInvalidValue;
  std::free(p);
  return cudaSuccess;
}

// Copies and fills are queued on their stream, with CUDA's documented exceptions, which return
// only once done (see copy); fills of host memory.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  return rt_emu::copy(dst, src, bytes, nullptr, true);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t s) {
  return rt_emu::copy(dst, src, bytes, s, false);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) { return cudaMemsetAsync(p, value, bytes, nullptr); }
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  if (!bytes) return cudaSuccess;
  rt_emu::Work fill = [=] { std::memset(p, value, bytes); };
  if (rt_emu::memory_type(p) == cudaMemoryTypeDevice)
    rt_emu::enqueue(s, std::move(fill));
  else
    rt_emu::run_in_order(s, std::move(fill));
  return cudaSuccess;
}

}  // extern "C"
