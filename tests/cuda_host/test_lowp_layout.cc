// The 16-bit backends' host arithmetic (cuda/lowp_layout.h), no GPU: activation sizes in float
// units, the NCHW/NHWC and OIHW/OHWI index maps, the per-channel reduction's grid; and the host
// round-to-nearest-even to bf16 and fp16 (nn/tensor.h) the GPU tests build their references
// with, against the CUDA headers' own host conversions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda/lowp_kernels.h"  // Lowp<T>
#include "cuda/lowp_layout.h"
#include "nn/tensor.h"

namespace rt::cuda {
namespace {

TEST(LowpLayout, ActFloatsHoldTwoPerFloatInWholeVectors) {
  EXPECT_EQ(lowp_act_floats(0), 0u);
  EXPECT_EQ(lowp_act_floats(1), 4u);   // one 16-byte vector
  EXPECT_EQ(lowp_act_floats(8), 4u);
  EXPECT_EQ(lowp_act_floats(9), 8u);
  EXPECT_EQ(lowp_act_floats(2 * 3 * 5 * 7), 108u);  // 210 values -> 27 vectors
  for (int64_t n = 1; n < 1000; ++n) {
    const size_t f = lowp_act_floats(n);
    EXPECT_GE(2 * f, size_t(n)) << n;         // room for every element
    EXPECT_EQ(f % 4, 0u) << n;                // whole vectors
    EXPECT_LT(2 * f, size_t(n) + 8) << n;     // at most one vector of padding
  }
}

TEST(LowpLayout, NchwAndNhwcMapsAreBijections) {
  const int64_t N = 2, C = 3, H = 4, W = 5;
  std::vector<int> seen_nchw(size_t(N * C * H * W), 0), seen_nhwc(seen_nchw.size(), 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w) {
          ++seen_nchw[size_t(nchw_index(n, c, h, w, C, H, W))];
          ++seen_nhwc[size_t(nhwc_index(n, c, h, w, C, H, W))];
        }
  for (size_t i = 0; i < seen_nchw.size(); ++i) {
    EXPECT_EQ(seen_nchw[i], 1) << i;
    EXPECT_EQ(seen_nhwc[i], 1) << i;
  }
  EXPECT_EQ(nhwc_index(0, 1, 0, 0, C, H, W), 1);      // channels innermost
  EXPECT_EQ(nhwc_index(0, 0, 0, 1, C, H, W), C);      // then columns
  EXPECT_EQ(nhwc_index(1, 0, 0, 0, C, H, W), H * W * C);
  EXPECT_EQ(nchw_index(0, 0, 0, 1, C, H, W), 1);
}

TEST(LowpLayout, WeightOhwiMap) {
  const WeightGeom g{4, 3, 2, 5};  // out, in, kh, kw
  EXPECT_EQ(g.count(), 120);
  std::vector<int> seen(size_t(g.count()), 0);
  for (int64_t o = 0; o < g.o; ++o)
    for (int64_t i = 0; i < g.i; ++i)
      for (int64_t h = 0; h < g.h; ++h)
        for (int64_t w = 0; w < g.w; ++w) {
          const int64_t oihw = ((o * g.i + i) * g.h + h) * g.w + w;
          const int64_t ohwi = ohwi_from_oihw(oihw, g);
          EXPECT_EQ(ohwi, ((o * g.h + h) * g.w + w) * g.i + i);
          ++seen[size_t(ohwi)];
        }
  for (int s : seen) EXPECT_EQ(s, 1);
  // A linear layer after global pooling (h = w = 1): the identity.
  const WeightGeom lin{10, 64, 1, 1};
  for (int64_t e = 0; e < lin.count(); ++e) EXPECT_EQ(ohwi_from_oihw(e, lin), e);
}

TEST(LowpLayout, ChannelReduceGridCoversEveryRowOnce) {
  for (int64_t rows : {1, 2, 63, 64, 65, 1000, 16384, 16385, 256 * 112 * 112})
    for (int64_t channels : {1, 3, 8, 24, 32, 33, 64, 520, 2048}) {
      const ChannelReduceGeom g = channel_reduce_geom(rows, channels);
      SCOPED_TRACE(std::to_string(rows) + " rows x " + std::to_string(channels));
      EXPECT_GE(g.chunks, 1);
      EXPECT_LE(g.chunks, kMaxChunks);
      EXPECT_GE(g.rows_per_chunk, kMinRowsPerChunk);
      EXPECT_GE(g.chunks * g.rows_per_chunk, rows);           // every row in some chunk
      EXPECT_LT((g.chunks - 1) * g.rows_per_chunk, rows);     // no empty chunk
      EXPECT_EQ(g.tiles, (channels + kChannelTile - 1) / kChannelTile);
      EXPECT_GE(g.tiles * kChannelTile, channels);
      // A large tensor spreads over about kTargetBlocks blocks, whatever its width.
      const int64_t across = g.vec_tiles > 0 ? g.vec_tiles : g.tiles;
      if (rows >= kMaxChunks * kMinRowsPerChunk) {
        EXPECT_GE(across * g.chunks, kTargetBlocks);
      }
      // The vector grid: every group of kVec channels in exactly one tile, a block within
      // kVecBlock threads (its shared sums sized for that), and enough rows per block that a warp
      // reads whole rows of narrow layers.
      if (channels % kVec != 0) {
        EXPECT_EQ(g.vec_tiles, 0);
        continue;
      }
      const int64_t groups = channels / kVec;
      EXPECT_GE(g.vec_groups, 1);
      EXPECT_LE(g.vec_groups, kVecMaxGroups);
      EXPECT_LE(g.vec_groups * g.vec_rows, kVecBlock);
      EXPECT_GE(g.vec_rows, kVecBlock / kVecMaxGroups);
      EXPECT_GE(g.vec_tiles * g.vec_groups, groups);
      EXPECT_LT((g.vec_tiles - 1) * g.vec_groups, groups);
      if (groups < kVecMaxGroups) {
        EXPECT_EQ(g.vec_groups, groups);  // one tile, no idle threads
      }
    }
  const ChannelReduceGeom empty = channel_reduce_geom(0, 5);
  EXPECT_EQ(empty.chunks, 0);
  EXPECT_EQ(empty.tiles, 0);
}

// What the backends hand the libraries for each type (the cuDNN type is checked on a GPU).
TEST(LowpLayout, StorageTypes) {
  static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2);  // lowp_act_floats holds for both
  EXPECT_STREQ(Lowp<bf16>::backend, "cuda-bf16");
  EXPECT_EQ(Lowp<bf16>::elem, Elem::bf16);
  EXPECT_EQ(Lowp<bf16>::blas, CUDA_R_16BF);
  EXPECT_STREQ(Lowp<f16>::backend, "cuda-fp16");
  EXPECT_EQ(Lowp<f16>::elem, Elem::f16);
  EXPECT_EQ(Lowp<f16>::blas, CUDA_R_16F);
}

TEST(HostRounding, Bf16RoundToNearestEven) {
  EXPECT_EQ(bf16_round(1.0f), 1.0f);
  EXPECT_EQ(bf16_round(-2.5f), -2.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(bf16_round(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(bf16_round(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  // Just above halfway rounds up.
  EXPECT_EQ(bf16_round(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)),
            1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3f80);
  EXPECT_TRUE(std::isinf(bf16_round(std::numeric_limits<float>::max())));  // overflows, as RN
  EXPECT_TRUE(std::isinf(bf16_round(std::numeric_limits<float>::infinity())));
  EXPECT_TRUE(std::isnan(bf16_round(std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload sits only in the low 16 bits must stay a NaN (not become inf).
  uint32_t u = 0x7f800001u;
  float low_nan;
  std::memcpy(&low_nan, &u, sizeof low_nan);
  EXPECT_TRUE(std::isnan(bf16_round(low_nan)));
  // 8 significant bits: the rounding error is at most half an ulp, 2^-8 of the value (the
  // unit roundoff the GPU tests' tolerances are built on).
  for (float v = 1e-3f; v < 1e3f; v *= 1.37f)
    EXPECT_LE(std::abs(bf16_round(v) - v), std::ldexp(v, -8)) << v;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint16_t cuda_f16_bits(float f) { return __half_raw(__float2half_rn(f)).x; }
float cuda_f16_value(uint16_t b) {
  __half_raw r;
  r.x = b;
  return __half2float(__half(r));
}

TEST(HostRounding, Fp16RoundToNearestEven) {
  EXPECT_EQ(to_f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(f16_round(-2.5f), -2.5f);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1); 1 + 3 * 2^-11 to 1 + 2^-9.
  EXPECT_EQ(f16_round(1.0f + std::ldexp(1.0f, -11)), 1.0f);
  EXPECT_EQ(f16_round(1.0f + 3 * std::ldexp(1.0f, -11)), 1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(f16_round(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)),
            1.0f + std::ldexp(1.0f, -10));
  // Range: 65504 is the largest finite value; from halfway to 2^16 (65520) up it is inf, below
  // that it rounds down to 65504 (IEEE round to nearest, as __float2half_rn: no saturation).
  EXPECT_EQ(f16_round(65504.0f), 65504.0f);
  EXPECT_EQ(f16_round(std::nextafter(65520.0f, 0.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_round(65520.0f)));
  EXPECT_EQ(f16_round(-1e6f), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isinf(f16_round(std::numeric_limits<float>::max())));
  EXPECT_TRUE(std::isnan(f16_round(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(f16_round(float_of(0x7f800001u))));  // payload below fp16's mantissa
  // Subnormals: steps of 2^-24 below 2^-14; 2^-25 is halfway to zero and ties to it.
  EXPECT_EQ(f16_round(std::ldexp(3.0f, -24)), std::ldexp(3.0f, -24));
  EXPECT_EQ(f16_round(std::ldexp(1.0f, -25)), 0.0f);
  EXPECT_EQ(f16_round(std::ldexp(1.5f, -25)), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_round(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -26)), std::ldexp(1.0f, -14));
  EXPECT_TRUE(std::signbit(f16_round(-1e-10f)));
  // 11 significant bits: the rounding error of a normal value is at most 2^-11 of it.
  for (float v = 1e-4f; v < 6e4f; v *= 1.37f)
    EXPECT_LE(std::abs(f16_round(v) - v), std::ldexp(v, -11)) << v;
}

// Every half widens exactly and narrows back to itself; a sweep over fp32 bit patterns (every
// exponent, both signs, mantissas that hit ties) rounds as the CUDA headers' host conversion.
TEST(HostRounding, Fp16AgreesWithCudaHeaders) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const f16_t h{uint16_t(b)};
    const float v = from_f16(h), want = cuda_f16_value(uint16_t(b));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(v)) << std::hex << b;
      continue;
    }
    ASSERT_EQ(std::memcmp(&v, &want, sizeof v), 0) << std::hex << b;
    ASSERT_EQ(to_f16(v).bits, uint16_t(b)) << std::hex << b;
  }
  for (uint64_t u = 0; u <= 0xffffffffu; u += 0x1001u) {
    for (uint32_t low : {0x0u, 0xfffu, 0x1000u, 0x1fffu, 0x2000u}) {  // ties of 13 dropped bits
      const float f = float_of((uint32_t(u) & ~0x1fffu) | low);
      if (std::isnan(f)) {
        ASSERT_TRUE(std::isnan(from_f16(to_f16(f))));
        continue;
      }
      ASSERT_EQ(to_f16(f).bits, cuda_f16_bits(f)) << f;
    }
  }
}

TEST(HostRounding, Bf16AgreesWithCudaHeaders) {
  for (uint64_t u = 0; u <= 0xffffffffu; u += 0x1001u) {
    for (uint32_t low : {0x0u, 0x7fffu, 0x8000u, 0xffffu}) {
      const float f = float_of((uint32_t(u) & ~0xffffu) | low);
      if (std::isnan(f)) continue;
      ASSERT_EQ(to_bf16(f).bits, __nv_bfloat16_raw(__float2bfloat16_rn(f)).x) << f;
    }
  }
}

}  // namespace
}  // namespace rt::cuda
