// Shared by the data tests: a loader's 8-bit output, normalized with the documented formula,
// equals its float output bit for bit (same seed, so the same samples, crops and flips).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "data/loader.h"

namespace rt::data::test {

inline std::vector<Batch> epoch_batches(const DataConfig& cfg, Split split, int rank, int world, int batch,
                                        int64_t epoch) {
  auto l = make_loader(cfg, split, rank, world, batch);
  l->start_epoch({epoch, 0});
  std::vector<Batch> out;
  Batch b;
  while (l->next(b)) out.push_back(b);
  return out;
}

// Runs one epoch of (split, rank of world) with Output::f32 and with Output::u8 and compares.
inline void expect_u8_normalizes_to_floats(DataConfig cfg, Split split, int rank = 0, int world = 2,
                                           int batch = 3, int64_t epoch = 1) {
  cfg.output = Output::f32;
  const std::vector<Batch> f = epoch_batches(cfg, split, rank, world, batch, epoch);
  cfg.output = Output::u8;
  const std::vector<Batch> u = epoch_batches(cfg, split, rank, world, batch, epoch);
  ASSERT_FALSE(f.empty());
  ASSERT_EQ(f.size(), u.size());
  const NormParams p = norm_params(cfg);
  const size_t hw = size_t(cfg.image_size) * cfg.image_size;
  for (size_t s = 0; s < f.size(); ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    ASSERT_EQ(f[s].n, u[s].n);
    EXPECT_EQ(f[s].indices, u[s].indices);
    EXPECT_EQ(f[s].labels, u[s].labels);
    EXPECT_TRUE(f[s].pixels.empty());
    EXPECT_TRUE(u[s].images.empty());
    ASSERT_EQ(f[s].images.size(), size_t(f[s].n) * 3 * hw);
    ASSERT_EQ(u[s].pixels.size(), f[s].images.size());
    size_t bad = 0;
    for (int j = 0; j < f[s].n; ++j)
      for (size_t i = 0; i < hw; ++i)
        for (int c = 0; c < 3; ++c) {
          const uint8_t px = u[s].pixels[(size_t(j) * hw + i) * 3 + c];
          const float want = std::fmaf(float(px), p.scale[c], p.shift[c]);  // one rounding
          const float got = f[s].images[(size_t(j) * 3 + c) * hw + i];
          if (std::memcmp(&want, &got, sizeof want) != 0 && bad++ < 3)
            ADD_FAILURE() << "image " << j << " pixel " << i << " channel " << c << ": float output " << got
                          << ", normalized byte " << int(px) << " gives " << want;
        }
    EXPECT_EQ(bad, 0u) << "values differ";
  }
}

}  // namespace rt::data::test
