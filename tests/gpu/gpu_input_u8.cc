// The CUDA backends' input import: the 8-bit path (upload + normalize_u8) against the host
// default that the CPU backends use, its buffer allocated at the first call only; the 16-bit
// backends' 8-bit path against their float import; and staged inputs (Backend::stage_input),
// which an import of the same host pointer takes once, whatever the host buffer holds by then,
// from the heap and from the backends' page-locked input_memory().
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/backend.h"
#include "cuda/input_stage.h"
#include "cuda/lowp_backend.h"
#include "cuda/memory.h"
#include "gpu_test_util.h"
#include "nn/ops.h"

namespace rt::cuda {
namespace {

using test::SlowStream;
using test::to_host;

// Distance in units in the last place between two finite floats (the bit patterns mapped to a
// line on which neighbouring floats are neighbouring integers, -0 and +0 both at 0).
int64_t ulps(float a, float b) {
  auto key = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, 4);
    return i >= 0 ? int64_t(i) : -int64_t(i & 0x7fffffff);
  };
  return std::abs(key(a) - key(b));
}

TEST(GpuInputU8, MatchesTheHostDefaultWithinOneUlpAndAllocatesOnce) {
  RT_REQUIRE_GPU();
  auto gpu = make_cuda_backend();
  auto ref = make_backend<float>("reference");
  const Shape s{3, 3, 9, 7};
  const size_t n = size_t(s.numel());
  const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  const NormParams p = norm_params(mean, std);
  DeviceBuffer dst(gpu->act_size(s) * sizeof(float));
  std::mt19937 g(5);
  int64_t allocs_after_first = -1;
  for (int call = 0; call < 3; ++call) {
    std::vector<uint8_t> px(n);
    for (uint8_t& b : px) b = uint8_t(g());
    px[0] = 0, px[1] = 255, px[n - 1] = 128;
    gpu->act_import_u8(px.data(), s, p, dst.as<float>());
    if (call == 0) allocs_after_first = alloc_stats().device_allocs;
    std::vector<float> want(ref->act_size(s)), got(n);
    ref->act_import_u8(px.data(), s, p, want.data());  // reference layout: NCHW
    gpu->act_export(dst.as<float>(), s, got.data());
    int64_t worst = 0;
    for (size_t i = 0; i < n; ++i) {
      const int64_t d = ulps(want[i], got[i]);
      ASSERT_EQ(d, 0) << "call " << call << " at " << i << ": " << got[i] << " vs " << want[i];
      worst = std::max(worst, d);
    }
    if (call == 0) RecordProperty("max_ulps", int(worst));
  }
  EXPECT_EQ(alloc_stats().device_allocs, allocs_after_first) << "act_import_u8 allocated after its first call";
}

std::vector<uint8_t> random_pixels(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint8_t> px(n);
  for (uint8_t& b : px) b = uint8_t(g());
  return px;
}

const NormParams& imagenet_norm() {
  static const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  static const NormParams p = norm_params(mean, std);
  return p;
}

// Exported as NCHW floats.
std::vector<float> exported(const Backend<float>& be, const DeviceBuffer& act, const Shape& s) {
  std::vector<float> out(size_t(s.numel()));
  be.act_export(act.as<float>(), s, out.data());
  return out;
}

// The same fp32 values, rounded once to the 16-bit type either way: equal bit for bit.
TEST(GpuInputU8, SixteenBitBackendsMatchTheirFloatImport) {
  RT_REQUIRE_GPU();
  auto ref = make_backend<float>("reference");
  const Shape s{2, 3, 5, 11};
  const auto px = random_pixels(size_t(s.numel()), 7);
  std::vector<float> floats(size_t(s.numel()));
  ref->act_import_u8(px.data(), s, imagenet_norm(), floats.data());
  for (DType t : {DType::bf16, DType::f16}) {
    auto be = make_cuda_lowp_backend(t);
    DeviceBuffer a(be->act_size(s) * sizeof(float)), b(be->act_size(s) * sizeof(float));
    be->act_import_u8(px.data(), s, imagenet_norm(), a.as<float>());
    be->act_import(floats.data(), s, b.as<float>());
    EXPECT_EQ(exported(*be, a, s), exported(*be, b, s)) << dtype_name(t);
  }
}

// stage_input, then (after sync(), as its contract asks) the host buffer overwritten: the import
// of that pointer still gives the staged data, once; the next import of it reads the host again.
// The host buffers on the heap (mem null) or in the backend's input_memory().
void check_staged(Backend<float>& be, const Shape& s, bool u8, HostMemory* mem) {
  const size_t n = size_t(s.numel());
  const auto bytes = random_pixels(n, 11);
  HostVector<uint8_t> px(bytes.begin(), bytes.end(), HostAllocator<uint8_t>(mem));
  HostVector<float> floats(n, 0.0f, HostAllocator<float>(mem));
  for (size_t i = 0; i < n; ++i) floats[i] = float(px[i]) / 64 - 2;
  DeviceBuffer want(be.act_size(s) * sizeof(float)), got(be.act_size(s) * sizeof(float));
  auto import = [&](DeviceBuffer& dst) {
    if (u8) be.act_import_u8(px.data(), s, imagenet_norm(), dst.as<float>());
    else be.act_import(floats.data(), s, dst.as<float>());
  };
  import(want);
  const auto expect = exported(be, want, s);
  for (int round = 0; round < 3; ++round) {  // both slots, then the first again
    if (u8) be.stage_input(px.data(), n);
    else be.stage_input(floats.data(), n * sizeof(float));
    be.sync();
    const auto keep_px = px;
    const auto keep_f = floats;
    std::fill(px.begin(), px.end(), uint8_t(0));
    std::fill(floats.begin(), floats.end(), 0.0f);
    const int64_t allocs = alloc_stats().device_allocs;
    import(got);
    if (round > 1) {
      EXPECT_EQ(alloc_stats().device_allocs, allocs) << "a staged import allocated";
    }
    EXPECT_EQ(exported(be, got, s), expect) << be.name() << (u8 ? " u8" : " float") << " round " << round;
    import(got);  // nothing staged for it now: the zeros on the host
    EXPECT_NE(exported(be, got, s), expect) << "a staging was used twice";
    px = keep_px;
    floats = keep_f;
  }
}

TEST(GpuInputU8, StagedInputsAreTakenOnce) {
  RT_REQUIRE_GPU();
  const Shape s{2, 3, 6, 5};
  auto fp32 = make_cuda_backend();
  EXPECT_TRUE(fp32->can_stage_input());
  std::vector<std::unique_ptr<Backend<float>>> all;
  all.push_back(std::move(fp32));
  for (DType t : {DType::bf16, DType::f16}) all.push_back(make_cuda_lowp_backend(t));
  for (auto& be : all) {
    ASSERT_EQ(be->input_memory(), &pinned_memory(0)) << be->name();
    for (HostMemory* mem : {static_cast<HostMemory*>(nullptr), be->input_memory()}) {
      check_staged(*be, s, false, mem);
      check_staged(*be, s, true, mem);
    }
  }
}

// The prefetch copy runs beside the compute stream's work, the first one too (its slots start
// free, not behind whatever the compute stream had queued when prefetching began), and a consumer
// queued on the compute stream reads the copied bytes.
TEST(GpuInputStage, CopiesBesideTheComputeStreamFromTheFirst) {
  RT_REQUIRE_GPU();
  SlowStream compute;
  InputStage stage(compute.s);
  std::vector<float> host(1024);
  std::iota(host.begin(), host.end(), 1.0f);
  DeviceBuffer out(host.size() * 4);
  for (int round = 0; round < 3; ++round) {
    compute.queue_slow_work();
    stage.stage(host.data(), host.size() * 4);
    stage.sync();
    EXPECT_EQ(cudaStreamQuery(compute.s), cudaErrorNotReady)
        << "round " << round << ": the copy waited for the compute stream's work";
    (void)cudaGetLastError();  // "not ready" may be kept as the last error
    ASSERT_TRUE(stage.consume(host.data(), host.size() * 4, [&](const void* d) {
      CUDA_CHECK(cudaMemcpyAsync(out.get(), d, host.size() * 4, cudaMemcpyDeviceToDevice, compute.s));
    }));
    CUDA_CHECK(cudaStreamSynchronize(compute.s));
    EXPECT_EQ(to_host<float>(out, host.size()), host) << "round " << round;
  }
}

// Batches in input_memory() are page-locked and counted, so the loader's lap of buffers shows.
TEST(GpuInputU8, InputMemoryIsCountedPinnedMemory) {
  RT_REQUIRE_GPU();
  const AllocStats before = alloc_stats();
  {
    HostVector<uint8_t> v(1 << 20, uint8_t(0), HostAllocator<uint8_t>(&pinned_memory(0)));
    cudaPointerAttributes a{};
    ASSERT_EQ(cudaPointerGetAttributes(&a, v.data()), cudaSuccess);
    EXPECT_EQ(a.type, cudaMemoryTypeHost);
    EXPECT_EQ(alloc_stats().pinned_allocs, before.pinned_allocs + 1);
    EXPECT_EQ(alloc_stats().pinned_bytes, before.pinned_bytes + (1 << 20));
  }
  EXPECT_EQ(alloc_stats().pinned_frees, before.pinned_frees + 1);
  EXPECT_EQ(alloc_stats().pinned_bytes, before.pinned_bytes);
}

TEST(GpuInputU8, RefusesAnInputWithoutThreeChannels) {
  RT_REQUIRE_GPU();
  auto gpu = make_cuda_backend();
  const Shape s{1, 4, 2, 2};
  std::vector<uint8_t> px(size_t(s.numel()));
  DeviceBuffer dst(size_t(s.numel()) * sizeof(float));
  EXPECT_THROW(gpu->act_import_u8(px.data(), s, NormParams{}, dst.as<float>()), Error);
}

}  // namespace
}  // namespace rt::cuda
