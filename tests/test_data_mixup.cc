// Mixup: the blend of each pair (i, n-1-i) in both pixel forms, the partner labels, the Beta
// draw's determinism and distribution, and what the loss is given.
#include <gtest/gtest.h>

#include <cmath>

#include "data/mixup.h"
#include "nn/error.h"

namespace rt::data {
namespace {

Batch batch_of(int n, size_t per) {
  Batch b;
  b.n = n;
  for (int i = 0; i < n; ++i) {
    b.labels.push_back(10 + i);
    b.indices.push_back(100 + i);
    for (size_t k = 0; k < per; ++k) {
      b.images.push_back(float(i) + 0.25f * float(k));
      b.pixels.push_back(uint8_t(40 * i + int(k)));
    }
  }
  return b;
}

TEST(DataMixup, BlendsEachImageWithItsReversedPartner) {
  const int n = 5;
  const size_t per = 3;
  const Batch orig = batch_of(n, per);
  Batch b = orig;
  mixup(b, 0.3);
  EXPECT_EQ(b.mix, 0.3);
  EXPECT_EQ(b.mixed, (std::vector<int32_t>{14, 13, 12, 11, 10}));
  EXPECT_EQ(b.labels, orig.labels);  // the first labels stay
  for (int i = 0; i < n; ++i)
    for (size_t k = 0; k < per; ++k) {
      const size_t at = size_t(i) * per + k, partner = size_t(n - 1 - i) * per + k;
      // In float (as documented), within its rounding of the blend in double.
      EXPECT_NEAR(b.images[at], 0.3 * orig.images[at] + 0.7 * orig.images[partner], 1e-6) << i << "," << k;
      EXPECT_EQ(b.pixels[at], uint8_t(std::lround(0.3 * orig.pixels[at] + 0.7 * orig.pixels[partner])))
          << i << "," << k;
    }
  // The middle image of an odd batch is its own partner.
  EXPECT_EQ(b.images[2 * per], orig.images[2 * per]);
  const Targets t = targets(b);
  EXPECT_EQ(t.labels, b.labels.data());
  EXPECT_EQ(t.mixed, b.mixed.data());
  EXPECT_EQ(t.mix, 0.3);
}

TEST(DataMixup, WeightOneKeepsTheBatchAndAMixedBatchIsRefused) {
  const Batch orig = batch_of(4, 6);
  Batch b = orig;
  mixup(b, 1.0);
  EXPECT_EQ(b.images, orig.images);
  EXPECT_EQ(b.pixels, orig.pixels);
  EXPECT_THROW(mixup(b, 0.5), Error);  // twice would blend blends
  Batch c = orig;
  EXPECT_THROW(mixup(c, -0.1), Error);
  EXPECT_THROW(mixup(c, std::nan("")), Error);
  EXPECT_EQ(targets(c).mixed, nullptr);  // unmixed: the labels alone
}

TEST(DataMixup, WeightsAreReproducibleAndBetaDistributed) {
  EXPECT_EQ(mixup_weight(0.2, 7, 3, 0, 1), mixup_weight(0.2, 7, 3, 0, 1));
  EXPECT_NE(mixup_weight(0.2, 7, 3, 0, 1), mixup_weight(0.2, 7, 3, 0, 0));  // ranks differ
  EXPECT_NE(mixup_weight(0.2, 7, 3, 0, 1), mixup_weight(0.2, 7, 3, 1, 1));  // passes differ
  EXPECT_NE(mixup_weight(0.2, 7, 3, 0, 1), mixup_weight(0.2, 7, 4, 0, 1));  // steps differ
  EXPECT_THROW(mixup_weight(0, 7, 3, 0, 1), Error);
  // Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)); a = 0.2 puts most weights near 0 or 1.
  for (double a : {0.2, 1.0, 4.0}) {
    const int draws = 20000;
    double sum = 0, sq = 0;
    int extreme = 0;
    for (int s = 0; s < draws; ++s) {
      const double w = mixup_weight(a, 1, s, 0, 0);
      ASSERT_TRUE(w >= 0 && w <= 1) << w;
      sum += w;
      sq += w * w;
      extreme += w < 0.1 || w > 0.9;
    }
    const double mean = sum / draws, var = sq / draws - mean * mean, want_var = 1 / (4 * (2 * a + 1));
    EXPECT_NEAR(mean, 0.5, 0.01) << "alpha " << a;
    EXPECT_NEAR(var, want_var, 0.05 * want_var) << "alpha " << a;
    if (a == 0.2) {
      EXPECT_GT(extreme, draws / 2);  // Beta(0.2, 0.2) puts ~67% there
    }
  }
}

}  // namespace
}  // namespace rt::data
