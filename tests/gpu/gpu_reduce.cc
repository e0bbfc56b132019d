// Device reduce_add / scale / ema_update against the CPU kernels' arithmetic (comm/reduce_cpu.cc: one fp32 add
// or multiply, then one round-to-nearest-even): equal bit for bit. The CPU side is written out
// here so that GPU-only builds, which have no comm/ (MPI), run it too.
#include <cuda_fp16.h>

#include <cmath>
#include <cstring>
#include <random>

#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/launch.h"
#include "cuda/reduce_device.h"
#include "tests/gpu/gpu_test_util.h"

namespace rt::cuda {
namespace {

using test::to_device;
using test::to_host;

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-100, 100);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}

uint16_t f16_bits(float f) { return __half_raw(__float2half_rn(f)).x; }
float f16_value(uint16_t b) {
  __half_raw r;
  r.x = b;
  return __half2float(__half(r));
}

void cpu_add_scale(float* a, const float* b, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) a[i] += b[i];
  for (size_t i = 0; i < n; ++i) a[i] *= s;
}
void cpu_add_scale(bf16_t* a, const bf16_t* b, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) a[i] = to_bf16(from_bf16(a[i]) + from_bf16(b[i]));
  for (size_t i = 0; i < n; ++i) a[i] = to_bf16(from_bf16(a[i]) * s);
}

// Counts around the vector width (tails), a prime, and one above a million; offset 1 makes every
// pointer misaligned for 16-byte vectors, forcing the scalar path.
const size_t kCounts[] = {0, 1, 7, 8, 9, 1001, (size_t{1} << 20) + 3};

TEST(GpuReduce, F32AddAndScaleMatchCpuBitwise) {
  RT_REQUIRE_GPU();
  for (size_t off : {0, 1})
    for (size_t n : kCounts) {
      auto a = random_floats(n + off, 1), b = random_floats(n + off, 2);
      DeviceBuffer da = to_device(a), db = to_device(b);
      reduce_add(Elem::f32, da.as<float>() + off, db.as<float>() + off, n, nullptr);
      scale(Elem::f32, da.as<float>() + off, n, 0.25f, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      cpu_add_scale(a.data() + off, b.data() + off, n, 0.25f);
      const auto got = to_host<float>(da, a.size());
      for (size_t i = 0; i < a.size(); ++i)
        ASSERT_EQ(got[i], a[i]) << "n " << n << " offset " << off << " at " << i;
    }
}

// The weights' moving average (train.ema): avg = fma(w, x - avg, avg), each operation rounded
// once, as Backend::ema_update_host computes it (fused by std::fma on the host).
TEST(GpuReduce, MovingAverageMatchesCpuBitwise) {
  RT_REQUIRE_GPU();
  for (size_t off : {0, 1})
    for (size_t n : kCounts)
      for (float w : {0.1f, 1e-4f}) {
        auto a = random_floats(n + off, 3), x = random_floats(n + off, 4);
        DeviceBuffer da = to_device(a), dx = to_device(x);
        ema_update(da.as<float>() + off, dx.as<float>() + off, n, w, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        for (size_t i = off; i < n + off; ++i) a[i] = std::fma(w, x[i] - a[i], a[i]);
        const auto got = to_host<float>(da, a.size());
        size_t differ = 0;
        for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&got[i], &a[i], 4) != 0;
        EXPECT_EQ(differ, 0u) << "n " << n << " offset " << off << " w " << w;
      }
}

TEST(GpuReduce, Bf16AddsInFp32AndRoundsOnceLikeCpu) {
  RT_REQUIRE_GPU();
  for (size_t off : {0, 1})
    for (size_t n : kCounts) {
      std::vector<bf16_t> a(n + off), b(n + off);
      auto fa = random_floats(n + off, 3), fb = random_floats(n + off, 4);
      for (size_t i = 0; i < a.size(); ++i) a[i] = to_bf16(fa[i]), b[i] = to_bf16(fb[i]);
      DeviceBuffer da = to_device(a), db = to_device(b);
      reduce_add(Elem::bf16, da.as<bf16_t>() + off, db.as<bf16_t>() + off, n, nullptr);
      scale(Elem::bf16, da.as<bf16_t>() + off, n, 1.0f / 3, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      cpu_add_scale(a.data() + off, b.data() + off, n, 1.0f / 3);
      const auto got = to_host<bf16_t>(da, a.size());
      for (size_t i = 0; i < a.size(); ++i)
        ASSERT_EQ(got[i].bits, a[i].bits) << "n " << n << " offset " << off << " at " << i;
    }
}

TEST(GpuReduce, F16AddsInFp32AndRoundsOnce) {
  RT_REQUIRE_GPU();
  for (size_t off : {0, 1})
    for (size_t n : kCounts) {
      std::vector<uint16_t> a(n + off), b(n + off);
      auto fa = random_floats(n + off, 5), fb = random_floats(n + off, 6);
      for (size_t i = 0; i < a.size(); ++i) a[i] = f16_bits(fa[i]), b[i] = f16_bits(fb[i]);
      DeviceBuffer da = to_device(a), db = to_device(b);
      reduce_add(Elem::f16, da.as<uint16_t>() + off, db.as<uint16_t>() + off, n, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = to_host<uint16_t>(da, a.size());
      for (size_t i = 0; i < a.size(); ++i) {
        const uint16_t want = i < off ? a[i] : f16_bits(f16_value(a[i]) + f16_value(b[i]));
        ASSERT_EQ(got[i], want) << "n " << n << " offset " << off << " at " << i;
      }
    }
}

// Gradient compression's conversions: f32 → bf16/f16 with the scale applied first and one
// rounding (the CPU's to_bf16 and the device's own __float2half_rn on the host), then back, exact.
// Values span fp16's overflow (from 65520) and subnormal range.
TEST(GpuReduce, CompressionConversionsRoundOnce) {
  RT_REQUIRE_GPU();
  const float s = 1.0f / 3;
  for (size_t off : {0, 1})
    for (size_t n : kCounts) {
      auto x = random_floats(n + off, 7);
      for (size_t i = 0; i < x.size(); ++i)
        x[i] *= i % 3 == 0 ? 3000.0f : i % 3 == 1 ? 1e-6f : 1.0f;  // past 65504·3, below 2^-14
      DeviceBuffer dx = to_device(x), db((n + off) * 2), dh((n + off) * 2), dback((n + off) * 4);
      convert(Elem::bf16, db.as<bf16_t>() + off, Elem::f32, dx.as<float>() + off, n, s, nullptr);
      convert(Elem::f16, dh.as<uint16_t>() + off, Elem::f32, dx.as<float>() + off, n, s, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const auto b = to_host<bf16_t>(db, n + off);
      const auto h = to_host<uint16_t>(dh, n + off);
      for (size_t i = off; i < x.size(); ++i) {
        ASSERT_EQ(b[i].bits, to_bf16(x[i] * s).bits) << "bf16, n " << n << " at " << i;
        ASSERT_EQ(h[i], f16_bits(x[i] * s)) << "f16, n " << n << " at " << i;
      }
      convert(Elem::f32, dback.as<float>() + off, Elem::f16, dh.as<uint16_t>() + off, n, 1.0f, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const auto back = to_host<float>(dback, n + off);
      for (size_t i = off; i < x.size(); ++i)
        ASSERT_EQ(back[i], f16_value(h[i])) << "f16 -> f32, n " << n << " at " << i;
    }
}

TEST(GpuReduce, ThroughTheRingInterface) {
  RT_REQUIRE_GPU();
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreate(&s));
  auto k = make_device_reduce_kernels(s);
  EXPECT_TRUE(k->supports(DType::f16));
  std::vector<float> a = {1, 2, 3}, b = {10, 20, 30};
  DeviceBuffer da = to_device(a), db = to_device(b);
  k->reduce_add(DType::f32, da.get(), db.get(), 3);
  k->scale(DType::f32, da.get(), 3, 0.5f);
  EXPECT_EQ(to_host<float>(da, 3), (std::vector<float>{5.5f, 11, 16.5f}));
  DeviceBuffer dw(3 * 2);
  k->convert(DType::bf16, dw.get(), DType::f32, da.get(), 3, 2.0f);
  k->convert(DType::f32, da.get(), DType::bf16, dw.get(), 3, 1.0f);
  EXPECT_EQ(to_host<float>(da, 3), (std::vector<float>{11, 22, 33}));
  CUDA_CHECK(cudaStreamDestroy(s));
}

// More elements than one launch (and than int32) covers: 2^31 + 9 bf16 values, 4 GiB per
// buffer. Filled by memset (every byte 0x3f: bf16 0x3f3f = 0.74609375), checked around the
// launch boundaries and at the tail.
TEST(GpuReduce, CountsBeyondTwoToThe31) {
  RT_REQUIRE_GPU();
  const size_t n = (size_t{1} << 31) + 9;
  DeviceBuffer da(n * 2), db(n * 2);
  CUDA_CHECK(cudaMemset(da.get(), 0x3f, n * 2));
  CUDA_CHECK(cudaMemset(db.get(), 0x3f, n * 2));
  reduce_add(Elem::bf16, da.get(), db.get(), n, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const uint16_t want = to_bf16(2 * from_bf16(bf16_t{0x3f3f})).bits;
  for (size_t at : {size_t{0}, kMaxLaunchElems - 1, kMaxLaunchElems, 2 * kMaxLaunchElems - 1,
                    2 * kMaxLaunchElems, n - 9, n - 1}) {
    const auto got = to_host<uint16_t>(da, 1, at);
    EXPECT_EQ(got[0], want) << "at " << at;
  }
}

}  // namespace
}  // namespace rt::cuda
