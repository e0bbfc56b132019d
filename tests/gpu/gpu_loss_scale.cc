// Loss-scaling kernels: the overflow flag and the unscaled values.
#include <cmath>
#include <cstring>
#include <limits>

#include "cuda/check.h"
#include "cuda/kernels.h"
#include "tests/gpu/gpu_test_util.h"

namespace rt::cuda {
namespace {

using test::to_device;
using test::to_host;

int read_flag(const DeviceBuffer& flag) { return to_host<int>(flag, 1)[0]; }

TEST(GpuLossScale, FlagsInfAndNanAnywhere) {
  RT_REQUIRE_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t n : {1, 8, 9, 1001, 1 << 20})
    for (size_t at : {size_t{0}, n / 2, n - 1})  // vector part and scalar tail
      for (float bad : {inf, -inf, nan}) {
        std::vector<float> v(n, 1.5f);
        DeviceBuffer flag(sizeof(int));
        flag.zero();
        DeviceBuffer d = to_device(v);
        nonfinite_check(Elem::f32, d.get(), n, flag.as<int>(), nullptr);
        EXPECT_EQ(read_flag(flag), 0) << "n " << n;
        v[at] = bad;
        d.upload(v.data(), n * sizeof(float));
        nonfinite_check(Elem::f32, d.get(), n, flag.as<int>(), nullptr);
        EXPECT_EQ(read_flag(flag), 1) << "n " << n << " at " << at << " value " << bad;
        const auto back = to_host<float>(d, n);
        EXPECT_EQ(std::memcmp(back.data(), v.data(), n * sizeof(float)), 0) << "the check wrote";
      }
}

TEST(GpuLossScale, UnscaleMultipliesAndChecksBf16) {
  RT_REQUIRE_GPU();
  const size_t n = 1003;
  std::vector<bf16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = to_bf16(float(i) * 1024.0f - 5000.0f);
  DeviceBuffer d = to_device(v), flag(sizeof(int));
  flag.zero();
  unscale_check(Elem::bf16, d.get(), n, 1.0f / 1024, flag.as<int>(), nullptr);
  EXPECT_EQ(read_flag(flag), 0);
  const auto got = to_host<bf16_t>(d, n);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(got[i].bits, to_bf16(from_bf16(v[i]) * (1.0f / 1024)).bits) << "at " << i;
  v[n - 1] = to_bf16(std::numeric_limits<float>::infinity());
  d.upload(v.data(), n * 2);
  unscale_check(Elem::bf16, d.get(), n, 1.0f / 1024, flag.as<int>(), nullptr);
  EXPECT_EQ(read_flag(flag), 1);
}

// A loss scale below 1 unscales by a factor above 1: a finite gradient can overflow on the way,
// and that step must be flagged (skipped), as the host backends count after scaling.
TEST(GpuLossScale, UnscaleFlagsOverflowOfTheProduct) {
  RT_REQUIRE_GPU();
  std::vector<float> v(37, 1.0f);
  v[20] = 2e38f;
  DeviceBuffer d = to_device(v), flag(sizeof(int));
  flag.zero();
  unscale_check(Elem::f32, d.get(), v.size(), 2.0f, flag.as<int>(), nullptr);
  EXPECT_EQ(read_flag(flag), 1);
  v[20] = 1e38f;  // 2e38 is still finite
  d.upload(v.data(), v.size() * sizeof(float));
  flag.zero();
  unscale_check(Elem::f32, d.get(), v.size(), 2.0f, flag.as<int>(), nullptr);
  EXPECT_EQ(read_flag(flag), 0);
  EXPECT_EQ(to_host<float>(d, v.size())[20], 2e38f);
}

}  // namespace
}  // namespace rt::cuda
