// The emulator itself: barriers and shuffles really wait for the other threads, every thread of a
// grid runs once with the right built-ins, and what the device refuses or hangs on fails loudly.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda/check.h"
#include "nn/error.h"
#include "tests/cuda_emu/emu.h"
#include "tests/cuda_emu/runtime.h"

namespace {

constexpr int kBlock = 256;

// Runs f, which must throw rt::Error with `text` in its message.
template <class F>
void expect_error(F&& f, const std::string& text) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one saying: " << text;
  } catch (const rt::Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

// Launches are queued on their stream (the default one here) and run when waited for.
void finish() { cudaDeviceSynchronize(); }

// Each thread publishes its index, then reads its neighbour's: correct only if the barrier held
// every thread back until all had written.
__global__ void rotate_kernel(int* out) {
  __shared__ int sh[kBlock];
  sh[threadIdx.x] = int(threadIdx.x) + 1000 * int(blockIdx.x);
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = sh[(threadIdx.x + 1) % blockDim.x];
}

TEST(emu_scheduler, BarrierWaitsForTheWholeBlock) {
  std::vector<int> out(3 * kBlock, -1);
  RT_EMU_LAUNCH(3, kBlock)([](int* o) { rotate_kernel(o); })(out.data());
  finish();
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < kBlock; ++t)
      ASSERT_EQ(out[b * kBlock + t], (t + 1) % kBlock + 1000 * b)
          << "block " << b << " thread " << t;
}

__global__ void warp_sum_kernel(float* out) {
  float v = float(threadIdx.x);
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  out[threadIdx.x] = v;
}

TEST(emu_scheduler, ShuffleExchangesWithinEachWarp) {
  std::vector<float> out(128, -1);
  RT_EMU_LAUNCH(1, 128)([](float* o) { warp_sum_kernel(o); })(out.data());
  finish();
  for (int t = 0; t < 128; ++t) {
    const int w = t / 32;
    // Lanes 32w .. 32w + 31 sum to 32 * 32w + 496.
    ASSERT_EQ(out[t], float(1024 * w + 496)) << "thread " << t;
  }
}

TEST(emu_scheduler, EveryThreadOfA3dGridRunsOnceWithItsBuiltins) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  const int threads = 4 * 3 * 2, blocks = 3 * 2 * 2;
  std::vector<int> hits(size_t(threads * blocks), 0);
  int bad = 0;
  RT_EMU_LAUNCH(grid, block)([&] {
    if (blockDim.x != 4 || blockDim.y != 3 || blockDim.z != 2 || gridDim.x != 3 ||
        gridDim.y != 2 || gridDim.z != 2)
      ++bad;
    const int b = int(blockIdx.x + 3 * (blockIdx.y + 2 * blockIdx.z));
    const int t = int(threadIdx.x + 4 * (threadIdx.y + 3 * threadIdx.z));
    ++hits[size_t(b * threads + t)];
  })();
  finish();
  EXPECT_EQ(bad, 0);
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "thread " << i;
}

// A kernel that reached no barrier in its first launch runs its threads one after another later:
// still every thread once, and a barrier reached after all is an error, not a wrong result.
TEST(emu_scheduler, KernelsWithoutBarriersRunStraightAndMayNotStartWaiting) {
  std::vector<int> hits(4 * 64, 0);
  auto kernel = [](int* h, bool wait) {
    if (wait) __syncthreads();
    ++h[blockIdx.x * blockDim.x + threadIdx.x];
  };
  for (int round = 0; round < 3; ++round) RT_EMU_LAUNCH(4, 64)(kernel)(hits.data(), false);
  finish();
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 3) << "thread " << i;
  expect_error(
      [&] {
        RT_EMU_LAUNCH(4, 64)(kernel)(hits.data(), true);
        finish();
      },
               "reached no barrier in its first launch");
}

TEST(emu_scheduler, ParametersAreCopiedPerThread) {
  std::vector<int> out(64, 0);
  // A thread that changes its copy of a parameter must not change the next thread's.
  RT_EMU_LAUNCH(1, 64)([](int* o, int base) {
    base += int(threadIdx.x);
    o[threadIdx.x] = base;
  })(out.data(), 7);
  finish();
  for (int t = 0; t < 64; ++t) ASSERT_EQ(out[t], 7 + t);
}

TEST(emu_scheduler, BarrierAfterSomeThreadsReturnedFails) {
  expect_error(
      [] {
        RT_EMU_LAUNCH(2, 64)([] {
          if (threadIdx.x == 5) return;
          __syncthreads();
        })();
        finish();
      },
      "__syncthreads reached by 63 of 64");
}

// Threads of a failed block that wait at a barrier, or never started, end with their locals
// destroyed, and the other blocks do not run.
struct Guard {
  static inline int made = 0, live = 0;
  Guard() { ++made, ++live; }
  ~Guard() { --live; }
};

TEST(emu_scheduler, AFailedBlocksThreadsUnwind) {
  Guard::made = 0;
  expect_error(
      [] {
        RT_EMU_LAUNCH(2, 64)([] {
          Guard g;
          if (threadIdx.x == 5) return;
          __syncthreads();
        })();
        finish();
      },
      "__syncthreads reached by 63 of 64");
  EXPECT_EQ(Guard::made, 64);  // block 0 only
  EXPECT_EQ(Guard::live, 0);
  // Thread 0 fails first: the others are never started.
  Guard::made = 0;
  expect_error(
      [] {
        RT_EMU_LAUNCH(2, 64)([] {
          Guard g;
          if (threadIdx.x == 0) throw rt::Error("thread 0 failed");
          __syncthreads();
        })();
        finish();
      },
      "thread 0 failed");
  EXPECT_EQ(Guard::made, 1);
  EXPECT_EQ(Guard::live, 0);
}

// The second warp takes the other branch, finishes its shuffle and ends; the first warp's barrier
// then waits for threads that are gone.
TEST(emu_scheduler, BarrierInADivergentBranchFails) {
  expect_error(
      [] {
        RT_EMU_LAUNCH(1, 64)([] {
          if (threadIdx.x < 32) {
            __syncthreads();
          } else {
            __shfl_xor_sync(0xffffffffu, 1, 1);
          }
        })();
        finish();
      },
      "__syncthreads reached by 32 of 64");
}

// The full first warp exchanged and ended; the 16 lanes of the second wait for 16 more.
TEST(emu_scheduler, ShuffleInAPartialWarpDeadlocks) {
  expect_error(
      [] {
        RT_EMU_LAUNCH(1, 48)([] { __shfl_xor_sync(0xffffffffu, 1.0f, 1); })();
        finish();
      },
      "deadlocked: of 48 threads 0 wait at __syncthreads, 16 at a warp shuffle (which "
      "needs all 32 lanes), 32 ended");
}

TEST(emu_scheduler, ConfigurationsTheDeviceRefusesFailAtTheLaunchCheck) {
  for (const dim3 block : {dim3(1025), dim3(32, 33), dim3(1, 1, 65), dim3(0)}) {
    int ran = 0;
    RT_EMU_LAUNCH(1, block)([&] { ++ran; })();
    finish();
    EXPECT_EQ(ran, 0);
    expect_error([] { CUDA_CHECK_LAUNCH(); }, "invalid configuration");
  }
  RT_EMU_LAUNCH(dim3(1, 65536), 32)([] {})();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  RT_EMU_LAUNCH(1, 32, 64 << 10)([] {})();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once, then cleared
}

TEST(emu_scheduler, NewDeviceMemoryReadsAsNaN) {
  const int64_t before = rt_emu::device_allocations();
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 16 * sizeof(float)), cudaSuccess);
  EXPECT_EQ(rt_emu::device_allocations(), before + 1);
  EXPECT_EQ(rt_emu::device_bytes_live(), int64_t(16 * sizeof(float)));
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(std::isnan(static_cast<float*>(p)[i]));
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue);  // twice
  EXPECT_EQ(rt_emu::device_bytes_live(), 0);
}

}  // namespace
