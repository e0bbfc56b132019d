// The CUDA gradient hooks on their own (no MPI): a fence waits for the work queued before it,
// staged downloads run behind their fence and uploads land by upload_wait(), the direct path's
// kernels and scratch are device ones, and nothing is allocated after set-up.
#include <numeric>

#include "cuda/check.h"
#include "cuda/device_grads.h"
#include "cuda/kernels.h"
#include "tests/gpu/gpu_test_util.h"

namespace rt::cuda {
namespace {

using comm::DevicePath;
using test::SlowStream;
using test::to_device;
using test::to_host;

std::vector<float> iota_floats(size_t n, float from) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(GpuDeviceGrads, FenceWaitsForTheWorkQueuedBeforeIt) {
  RT_REQUIRE_GPU();
  SlowStream compute;
  DeviceBuffer grads(4096);
  auto hooks = make_device_grads(compute.s, DevicePath::direct);
  hooks->setup(grads.get(), grads.bytes(), 4);
  for (int round = 0; round < 6; ++round) {  // more fences than slots: reused events
    compute.queue_slow_work();
    const uint64_t token = hooks->record();
    EXPECT_EQ(cudaStreamQuery(compute.s), cudaErrorNotReady) << "the slow work finished too soon to tell";
    (void)cudaGetLastError();  // "not ready" may be kept as the last error: not the next launch's
    hooks->wait(token);
    EXPECT_EQ(cudaStreamQuery(compute.s), cudaSuccess) << "round " << round;
  }
}

TEST(GpuDeviceGrads, StagedDownloadsBehindTheFenceAndUploadsBack) {
  RT_REQUIRE_GPU();
  SlowStream compute;
  const size_t n = 300007;  // three "buckets" of ragged sizes
  const size_t cuts[4] = {0, 100000, 250000, n};
  DeviceBuffer grads(n * 4), values = to_device(iota_floats(n, 1));
  // On the compute stream: a fill on the default stream would not be ordered with its work.
  CUDA_CHECK(cudaMemsetAsync(grads.get(), 0, grads.bytes(), compute.s));
  auto hooks = make_device_grads(compute.s, DevicePath::staged);
  EXPECT_EQ(hooks->path(), DevicePath::staged);
  hooks->setup(grads.get(), grads.bytes(), 3);
  const AllocStats after_setup = alloc_stats();
  for (int step = 0; step < 3; ++step) {
    // "Backward": slow work, then the values land in the gradient buffer, bucket by bucket.
    uint64_t tickets[3];
    for (int b = 2; b >= 0; --b) {
      compute.queue_slow_work(20);
      const size_t off = cuts[b] * 4, bytes = (cuts[b + 1] - cuts[b]) * 4;
      CUDA_CHECK(cudaMemcpyAsync(grads.as<char>() + off, values.as<char>() + off, bytes,
                                 cudaMemcpyDeviceToDevice, compute.s));
      tickets[b] = hooks->download(off, bytes, hooks->record());
    }
    float* host = reinterpret_cast<float*>(hooks->host());
    for (int b = 2; b >= 0; --b) {
      hooks->download_wait(tickets[b]);
      for (size_t i = cuts[b]; i < cuts[b + 1]; ++i)
        ASSERT_EQ(host[i], float(i + 1)) << "step " << step << " bucket " << b << " at " << i;
      for (size_t i = cuts[b]; i < cuts[b + 1]; ++i) host[i] = -host[i];
      hooks->upload(cuts[b] * 4, (cuts[b + 1] - cuts[b]) * 4);
    }
    hooks->upload_wait();
    const auto got = to_host<float>(grads, n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], -float(i + 1)) << "step " << step << " at " << i;
  }
  const AllocStats end = alloc_stats();
  EXPECT_EQ(end.device_allocs, after_setup.device_allocs);
  EXPECT_EQ(end.pinned_allocs, after_setup.pinned_allocs);
  EXPECT_THROW(hooks->download(n * 4 - 4, 8, 0), Error);  // past the end
}

TEST(GpuDeviceGrads, SetupAllocatesOnlyWhatItsPathNeeds) {
  RT_REQUIRE_GPU();
  SlowStream compute;
  DeviceBuffer grads(1 << 20);
  const AllocStats before = alloc_stats();
  {
    auto staged = make_device_grads(compute.s, DevicePath::staged);
    staged->setup(grads.get(), grads.bytes(), 8);
    EXPECT_EQ(alloc_stats().pinned_allocs, before.pinned_allocs + 1);  // the mirror
    EXPECT_EQ(alloc_stats().pinned_bytes, before.pinned_bytes + int64_t(grads.bytes()));
    EXPECT_EQ(alloc_stats().device_allocs, before.device_allocs);
    EXPECT_THROW(staged->setup(grads.get(), grads.bytes(), 8), Error);
  }
  EXPECT_EQ(alloc_stats().pinned_bytes, before.pinned_bytes);  // freed with the hooks
  {
    // Compressed staging: a mirror of half the bytes, and the 16-bit values on the device.
    auto staged = make_device_grads(compute.s, DevicePath::staged);
    EXPECT_TRUE(staged->stage_as(DType::bf16, 0.5f));
    staged->setup(grads.get(), grads.bytes(), 8);
    EXPECT_FALSE(staged->stage_as(DType::f16, 0.5f));  // too late: set up
    EXPECT_EQ(alloc_stats().pinned_bytes, before.pinned_bytes + int64_t(grads.bytes() / 2));
    EXPECT_EQ(alloc_stats().device_bytes, before.device_bytes + int64_t(grads.bytes() / 2));
  }
  EXPECT_EQ(alloc_stats().pinned_bytes, before.pinned_bytes);
  EXPECT_EQ(alloc_stats().device_bytes, before.device_bytes);
  const AllocStats staged_done = alloc_stats();
  auto direct = make_device_grads(compute.s, DevicePath::direct);
  EXPECT_FALSE(direct->stage_as(DType::bf16, 1.0f));  // staging only
  direct->setup(grads.get(), grads.bytes(), 8);
  EXPECT_EQ(alloc_stats().pinned_allocs, staged_done.pinned_allocs);  // none
  EXPECT_EQ(direct->host(), nullptr);
  // Direct: device kernels and device scratch, counted.
  const MemorySpace* space = direct->scratch_space();
  ASSERT_NE(space, nullptr);
  EXPECT_FALSE(space->host_accessible());
  void* scratch = space->allocate(4096);
  EXPECT_EQ(alloc_stats().device_allocs, staged_done.device_allocs + 1);
  {
    const std::vector<float> a = {1, 2, 3}, b = {10, 20, 30};
    DeviceBuffer da = to_device(a);
    space->from_host(scratch, b.data(), 12);
    direct->kernels().reduce_add(DType::f32, da.get(), scratch, 3);  // done when it returns
    EXPECT_EQ(to_host<float>(da, 3), (std::vector<float>{11, 22, 33}));
  }
  space->deallocate(scratch, 4096);
  EXPECT_EQ(alloc_stats().device_bytes, before.device_bytes);
}

}  // namespace
}  // namespace rt::cuda
