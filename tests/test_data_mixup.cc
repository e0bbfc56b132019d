// Mixup and CutMix: the blend or box swap of each pair (i, n-1-i) in both pixel forms, the
// partner labels, the draws' determinism and distributions, and what the loss is given.
#include <gtest/gtest.h>

#include <cmath>

#include "data/mixup.h"
#include "nn/error.h"

namespace rt::data {
namespace {

// n images of s x s: float NCHW and 8-bit NHWC, every value distinct within an image's channel.
Batch batch_of(int n, int64_t s) {
  Batch b;
  b.n = n;
  const size_t per = size_t(3 * s * s);
  for (int i = 0; i < n; ++i) {
    b.labels.push_back(10 + i);
    b.indices.push_back(100 + i);
    for (size_t k = 0; k < per; ++k) {
      b.images.push_back(float(i) + 0.25f * float(k));
      b.pixels.push_back(uint8_t(40 * i + int(k % 40)));
    }
  }
  return b;
}

MixDraw mixup_of(double mix) { return MixDraw{.mix = mix}; }

TEST(DataMixup, BlendsEachImageWithItsReversedPartner) {
  const int n = 5;
  const int64_t s = 2;
  const size_t per = 12;
  const Batch orig = batch_of(n, s);
  Batch b = orig;
  mix_batch(b, mixup_of(0.3), s);
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
  const Batch orig = batch_of(4, 2);
  Batch b = orig;
  mix_batch(b, mixup_of(1.0), 2);
  EXPECT_EQ(b.images, orig.images);
  EXPECT_EQ(b.pixels, orig.pixels);
  EXPECT_THROW(mix_batch(b, mixup_of(0.5), 2), Error);  // twice would blend blends
  Batch c = orig;
  EXPECT_THROW(mix_batch(c, mixup_of(-0.1), 2), Error);
  EXPECT_THROW(mix_batch(c, mixup_of(std::nan("")), 2), Error);
  EXPECT_THROW(mix_batch(c, mixup_of(0.5), 3), Error);  // not images of 3 x 3
  EXPECT_EQ(targets(c).mixed, nullptr);  // unmixed: the labels alone
}

// CutMix swaps the box between partners, in each layout: image i holds image n-1-i's pixels
// inside the box and its own outside.
TEST(DataMixup, CutMixSwapsTheBoxBetweenPartners) {
  const int n = 4;
  const int64_t s = 5;
  const Batch orig = batch_of(n, s);
  Batch b = orig;
  const MixDraw d{.cutmix = true, .mix = 1 - 6.0 / 25, .top = 1, .left = 2, .height = 2, .width = 3};
  mix_batch(b, d, s);
  EXPECT_EQ(b.mix, d.mix);
  EXPECT_EQ(b.mixed, (std::vector<int32_t>{13, 12, 11, 10}));
  size_t inside = 0;
  for (int i = 0; i < n; ++i)
    for (int64_t y = 0; y < s; ++y)
      for (int64_t x = 0; x < s; ++x) {
        const bool in = y >= 1 && y < 3 && x >= 2 && x < 5;
        inside += in && i == 0;
        const int src = in ? n - 1 - i : i;
        for (int64_t c = 0; c < 3; ++c) {
          const size_t nchw = size_t(((i * 3 + c) * s + y) * s + x), src_nchw = size_t(((src * 3 + c) * s + y) * s + x);
          const size_t nhwc = size_t(((i * s + y) * s + x) * 3 + c), src_nhwc = size_t(((src * s + y) * s + x) * 3 + c);
          EXPECT_EQ(b.images[nchw], orig.images[src_nchw]) << i << " " << y << "," << x << " c" << c;
          EXPECT_EQ(b.pixels[nhwc], orig.pixels[src_nhwc]) << i << " " << y << "," << x << " c" << c;
        }
      }
  EXPECT_EQ(inside, 6u);
  Batch c = orig;
  MixDraw off = d;
  off.left = 3;  // 3 + 3 > 5
  EXPECT_THROW(mix_batch(c, off, s), Error);
}

TEST(DataMixup, DrawsAreReproducibleAndBetaDistributed) {
  auto w = [](double a, int64_t step, int64_t pass, int rank) { return draw_mix(a, 0, 8, 7, step, pass, rank).mix; };
  EXPECT_EQ(w(0.2, 3, 0, 1), w(0.2, 3, 0, 1));
  EXPECT_NE(w(0.2, 3, 0, 1), w(0.2, 3, 0, 0));  // ranks differ
  EXPECT_NE(w(0.2, 3, 0, 1), w(0.2, 3, 1, 1));  // passes differ
  EXPECT_NE(w(0.2, 3, 0, 1), w(0.2, 4, 0, 1));  // steps differ
  EXPECT_THROW(draw_mix(0, 0, 8, 7, 3, 0, 1), Error);
  EXPECT_THROW(draw_mix(-1, 1, 8, 7, 3, 0, 1), Error);
  // Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)); a = 0.2 puts most weights near 0 or 1.
  for (double a : {0.2, 1.0, 4.0}) {
    const int draws = 20000;
    double sum = 0, sq = 0;
    int extreme = 0;
    for (int s = 0; s < draws; ++s) {
      const MixDraw d = draw_mix(a, 0, 8, 1, s, 0, 0);
      ASSERT_FALSE(d.cutmix);
      ASSERT_TRUE(d.mix >= 0 && d.mix <= 1) << d.mix;
      sum += d.mix;
      sq += d.mix * d.mix;
      extreme += d.mix < 0.1 || d.mix > 0.9;
    }
    const double mean = sum / draws, var = sq / draws - mean * mean, want_var = 1 / (4 * (2 * a + 1));
    EXPECT_NEAR(mean, 0.5, 0.01) << "alpha " << a;
    EXPECT_NEAR(var, want_var, 0.05 * want_var) << "alpha " << a;
    if (a == 0.2) {
      EXPECT_GT(extreme, draws / 2);  // Beta(0.2, 0.2) puts ~67% there
    }
  }
}

// CutMix's boxes lie in the image and its weight is the share left; with both alphas set, about
// half the batches take each. A box of side s sqrt(1 - lam) centred in a large image keeps
// lam's mean of 1/2 (clipping at the edges only raises it).
TEST(DataMixup, CutMixBoxesAndTheSwitch) {
  const int64_t s = 224;
  const int draws = 4000;
  int cut = 0;
  double sum = 0;
  for (int step = 0; step < draws; ++step) {
    const MixDraw d = draw_mix(0, 1.0, s, 5, step, 0, 0);
    ASSERT_TRUE(d.cutmix);
    ASSERT_TRUE(d.top >= 0 && d.left >= 0 && d.top + d.height <= s && d.left + d.width <= s) << step;
    EXPECT_DOUBLE_EQ(d.mix, 1 - double(d.height * d.width) / double(s * s)) << step;
    sum += d.mix;
    cut += draw_mix(0.2, 1.0, s, 5, step, 0, 0).cutmix;
  }
  EXPECT_GT(sum / draws, 0.5);
  EXPECT_LT(sum / draws, 0.75);
  // The box is `side` pixels wide about its centre where no edge clips it, whatever the parity of
  // side: odd sides as well as even ones (centre - side/2 + side, not centre + side/2, which
  // would cut every odd side down by one).
  int odd = 0, even = 0;
  for (int step = 0; step < draws; ++step) {
    const MixDraw d = draw_mix(0, 1.0, s, 5, step, 0, 0);
    if (d.top == 0 || d.left == 0 || d.top + d.height == s || d.left + d.width == s || d.height == 0) continue;
    EXPECT_EQ(d.height, d.width) << step;  // unclipped: both are `side`
    (d.height % 2 ? odd : even) += 1;
  }
  EXPECT_GT(odd, 100);
  EXPECT_GT(even, 100);
  EXPECT_NEAR(double(cut) / draws, 0.5, 0.03);
}

}  // namespace
}  // namespace rt::data
