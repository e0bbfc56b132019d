// Device arena (one allocation, aligned regions) and pinned staging (chunked copies both ways,
// nothing allocated per transfer).
#include <cstring>
#include <numeric>
#include <string>

#include "cuda/check.h"
#include "cuda/device_arena.h"
#include "cuda/staging.h"
#include "tests/gpu/gpu_test_util.h"

namespace rt::cuda {
namespace {

using test::to_device;
using test::to_host;

TEST(GpuArena, OneAllocationForAllRegions) {
  RT_REQUIRE_GPU();
  const AllocStats before = alloc_stats();
  DeviceArena a;
  const size_t p = a.reserve("params", 1000 * 4), g = a.reserve("grads", 1000 * 4),
               f = a.reserve("flag", 4, 4);
  EXPECT_THROW(a.ptr(p), Error);  // not allocated yet
  a.finalize();
  EXPECT_EQ(alloc_stats().device_allocs, before.device_allocs + 1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.ptr(p)) % kArenaAlign, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.ptr(g)) % kArenaAlign, 0u);
  EXPECT_EQ(a.as<char>(g) - a.as<char>(p), 4096);
  std::vector<float> ones(1000, 1.0f);
  CUDA_CHECK(cudaMemcpy(a.ptr(g), ones.data(), 4000, cudaMemcpyHostToDevice));
  int zero = -1;
  CUDA_CHECK(cudaMemcpy(&zero, a.ptr(f), 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(zero, 0);  // zeroed at finalize
  EXPECT_THROW(a.reserve("late", 4), Error);
  EXPECT_THROW(a.finalize(), Error);
  EXPECT_THROW(a.ptr(99), Error);
}

// More than the device has: rt::OutOfMemory saying what was asked, what was free of how much and
// what this process holds; counters unchanged, and the device usable after it.
TEST(GpuMemory, TooLargeAnAllocationIsOutOfMemoryWithTheDeviceFigures) {
  RT_REQUIRE_GPU();
  size_t free = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  DeviceBuffer held(size_t{1} << 20);
  const AllocStats before = alloc_stats();
  std::string m;
  try {
    DeviceBuffer b(total + (size_t{1} << 30));
    ADD_FAILURE() << "an allocation larger than the device succeeded";
  } catch (const OutOfMemory& e) {
    m = e.what();
  }
  EXPECT_NE(m.find("cudaMalloc of " + std::to_string(total + (size_t{1} << 30)) + " bytes failed"),
            std::string::npos) << m;
  EXPECT_NE(m.find(" free of "), std::string::npos) << m;
  EXPECT_NE(m.find("held by this process's ringtrain buffers"), std::string::npos) << m;
  EXPECT_NE(m.find(" GiB"), std::string::npos) << m;  // sizes in units a reader takes in
  EXPECT_EQ(alloc_stats().device_allocs, before.device_allocs);
  EXPECT_EQ(alloc_stats().device_bytes, before.device_bytes);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
  DeviceBuffer after(size_t{1} << 20);
  EXPECT_NE(after.get(), nullptr);
}

TEST(GpuStaging, DownloadAndUploadInChunks) {
  RT_REQUIRE_GPU();
  const size_t n = (size_t{10} << 20) + 12345;  // bytes: not a multiple of the chunk
  std::vector<uint8_t> src(n);
  std::iota(src.begin(), src.end(), uint8_t{0});
  DeviceBuffer d = to_device(src), back(n);
  for (int slots : {1, 2, 3}) {
    StagingPipeline pipe((size_t{1} << 20) + 7, slots);
    const AllocStats before = alloc_stats();
    std::vector<uint8_t> got(n);
    size_t next = 0;
    pipe.download(d.get(), n, [&](const void* host, size_t off, size_t len) {
      EXPECT_EQ(off, next);  // chunks in order
      std::memcpy(got.data() + off, host, len);
      next = off + len;
    });
    EXPECT_EQ(next, n);
    ASSERT_EQ(got, src) << slots << " slots";
    pipe.upload(back.get(), n, [&](void* host, size_t off, size_t len) {
      std::memcpy(host, src.data() + off, len);
    });
    ASSERT_EQ(to_host<uint8_t>(back, n), src) << slots << " slots";
    const AllocStats after = alloc_stats();
    EXPECT_EQ(after.device_allocs, before.device_allocs);
    EXPECT_EQ(after.pinned_allocs, before.pinned_allocs);
  }
}

}  // namespace
}  // namespace rt::cuda
