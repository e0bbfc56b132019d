// The bf16 backend's host arithmetic (cuda/bf16_layout.h), no GPU: activation sizes in float
// units, the NCHW/NHWC and OIHW/OHWI index maps, the per-channel reduction's grid and
// round-to-nearest-even.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cuda/bf16_layout.h"

namespace rt::cuda {
namespace {

TEST(Bf16Layout, ActFloatsHoldTwoPerFloatInWholeVectors) {
  EXPECT_EQ(bf16_act_floats(0), 0u);
  EXPECT_EQ(bf16_act_floats(1), 4u);   // one 16-byte vector
  EXPECT_EQ(bf16_act_floats(8), 4u);
  EXPECT_EQ(bf16_act_floats(9), 8u);
  EXPECT_EQ(bf16_act_floats(2 * 3 * 5 * 7), 108u);  // 210 bf16 -> 27 vectors
  for (int64_t n = 1; n < 1000; ++n) {
    const size_t f = bf16_act_floats(n);
    EXPECT_GE(2 * f, size_t(n)) << n;         // room for every element
    EXPECT_EQ(f % 4, 0u) << n;                // whole vectors
    EXPECT_LT(2 * f, size_t(n) + 8) << n;     // at most one vector of padding
  }
}

TEST(Bf16Layout, NchwAndNhwcMapsAreBijections) {
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

TEST(Bf16Layout, WeightOhwiMap) {
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

TEST(Bf16Layout, ChannelReduceGridCoversEveryRowOnce) {
  for (int64_t rows : {1, 2, 63, 64, 65, 1000, 16384, 16385, 256 * 112 * 112})
    for (int64_t channels : {1, 3, 32, 33, 2048}) {
      const ChannelReduceGeom g = channel_reduce_geom(rows, channels);
      SCOPED_TRACE(std::to_string(rows) + " rows x " + std::to_string(channels));
      EXPECT_GE(g.chunks, 1);
      EXPECT_LE(g.chunks, kMaxChunks);
      EXPECT_GE(g.rows_per_chunk, kMinRowsPerChunk);
      EXPECT_GE(g.chunks * g.rows_per_chunk, rows);           // every row in some chunk
      EXPECT_LT((g.chunks - 1) * g.rows_per_chunk, rows);     // no empty chunk
      EXPECT_EQ(g.tiles, (channels + kChannelTile - 1) / kChannelTile);
      EXPECT_GE(g.tiles * kChannelTile, channels);
    }
  const ChannelReduceGeom empty = channel_reduce_geom(0, 5);
  EXPECT_EQ(empty.chunks, 0);
  EXPECT_EQ(empty.tiles, 0);
}

TEST(Bf16Layout, RoundToNearestEven) {
  EXPECT_EQ(bf16_round(1.0f), 1.0f);
  EXPECT_EQ(bf16_round(-2.5f), -2.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(bf16_round(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(bf16_round(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  // Just above halfway rounds up.
  EXPECT_EQ(bf16_round(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)),
            1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(bf16_bits_from_float(1.0f), 0x3f80);
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

}  // namespace
}  // namespace rt::cuda
