// A host emulator of the CUDA execution model, enough for the backend's own kernels (cuda/*.cu) to
// run on a machine without a GPU, compiled by the host compiler: every block's threads run as
// cooperative fibers on the calling thread, so __syncthreads and warp shuffles really wait for
// the other threads, __shared__ memory is really shared by a block, and launch configurations are
// checked against the device's limits. What it cannot show: timing, races between blocks (blocks
// run one after another), and the real cuDNN and cuBLAS (cudnn.cc and cublas.cc stand in for
// them, following their documentation).
//
// Launches, copies and fills are queued on their stream and run when something waits for them
// (streams.h).
//
// The build force-includes this header into each kernel source after rewriting every
// `kernel<<<grid, block, smem, stream>>>(args)` into
// `RT_EMU_LAUNCH(grid, block, ...)(kernel)(args)`
// (tests/cuda_emu/cu_to_host.cmake); cuda_runtime.h then declares the runtime calls, which
// tests/cuda_emu/runtime.cc defines on host memory.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "tests/cuda_emu/streams.h"

// Under a host compiler cuda_runtime.h defines the execution-space keywords as nothing; a block's
// shared memory becomes a function-local static, one instance per OS thread that the block's
// fibers share (the blocks of a launch run one after another, so they may reuse it; launches from
// other threads, such as a communication thread's, have their own).
#undef __shared__
#define __shared__ static thread_local

namespace rt_emu {

// The built-in variables of the thread now running (set by the scheduler at every switch).
struct Builtins {
  uint3 thread_idx{0, 0, 0};
  uint3 block_idx{0, 0, 0};
  dim3 block_dim{1, 1, 1};
  dim3 grid_dim{1, 1, 1};
};
Builtins& builtins();

// Whether the device would start a grid of this shape: if not, the launch's error becomes what
// cudaGetLastError returns next on this thread, as on the device, and nothing runs.
bool launch_ok(dim3 grid, dim3 block, size_t shared_bytes);

// Runs body(thread) for every thread of every block of the grid (one launch_ok accepted), blocks
// in order, the threads of a block as fibers (or, for a kernel whose first launch reached no
// barrier, one after another).
// `kernel` identifies the kernel. Throws rt::Error for a deadlock (a barrier some threads of the
// block never reach) or a misuse of a warp operation; the launch's stream runs it (streams.h), so
// the error reaches whoever waits for that stream.
void run_grid(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body,
              const std::type_info& kernel);

// Barriers: the block's (__syncthreads) and the running thread's warp's.
void sync_block();
void sync_warp();
// The running thread's linear index in its block, and its scratch slot for warp exchanges.
unsigned linear_thread();
unsigned char* warp_slot(unsigned linear);
constexpr size_t kWarpSlotBytes = 16;

template <class Kernel>
struct Launch {
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
  Kernel kernel;
  // The arguments are copied at the launch, as the device's are; each thread then gets its own
  // copy, as each device thread has.
  template <class... Args>
  void operator()(Args&&... args) {
    if (!launch_ok(grid, block, shared_bytes)) return;
    enqueue(stream, [grid = grid, block = block, smem = shared_bytes, kernel = kernel,
                     params = std::tuple<std::decay_t<Args>...>(std::forward<Args>(args)...)] {
      run_grid(grid, block, smem, [&] { std::apply(kernel, params); }, typeid(Kernel));
    });
  }
};

struct Config {
  dim3 grid, block;
  size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
  Config(dim3 g, dim3 b, size_t smem = 0, cudaStream_t s = nullptr)
      : grid(g), block(b), shared_bytes(smem), stream(s) {}
  template <class Kernel>
  Launch<Kernel> operator()(Kernel k) const {
    return {grid, block, shared_bytes, stream, std::move(k)};
  }
};

}  // namespace rt_emu

#define RT_EMU_LAUNCH(...) ::rt_emu::Config(__VA_ARGS__)
#define threadIdx (::rt_emu::builtins().thread_idx)
#define blockIdx (::rt_emu::builtins().block_idx)
#define blockDim (::rt_emu::builtins().block_dim)
#define gridDim (::rt_emu::builtins().grid_dim)

inline void __syncthreads() { ::rt_emu::sync_block(); }

// The warp exchanges every lane's value, then each reads its partner's; the second barrier keeps
// a fast lane's next shuffle from overwriting a value not yet read.
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(sizeof(T) <= ::rt_emu::kWarpSlotBytes && std::is_trivially_copyable_v<T>);
  if (mask != 0xffffffffu || width != 32)
    throw std::logic_error("cuda emulator: shuffles of full warps only");
  const unsigned self = ::rt_emu::linear_thread();
  std::memcpy(::rt_emu::warp_slot(self), &v, sizeof v);
  ::rt_emu::sync_warp();
  T r;
  std::memcpy(&r, ::rt_emu::warp_slot((self & ~31u) | ((self & 31u) ^ unsigned(lane_mask))),
              sizeof r);
  ::rt_emu::sync_warp();
  return r;
}

// One OS thread runs all fibers, so read-modify-write is atomic already.
inline int atomicCAS(int* p, int compare, int val) {
  const int old = *p;
  if (old == compare) *p = val;
  return old;
}
inline unsigned atomicMin(unsigned* p, unsigned val) {
  const unsigned old = *p;
  if (val < old) *p = val;
  return old;
}

// Correctly rounded single operations: the host compiler neither contracts these (ISO C++ mode,
// no FMA in baseline x86-64) nor reorders them.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }

using std::isfinite;
using std::isnan;
