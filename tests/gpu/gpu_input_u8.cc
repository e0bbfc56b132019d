// The CUDA backend's 8-bit input import (upload + normalize_u8) against the host default that
// the CPU backends use, and its staging buffer: allocated at the first call only.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>

#include "cuda/backend.h"
#include "gpu_test_util.h"
#include "nn/ops.h"

namespace rt::cuda {
namespace {

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
