// Synthetic mode: deterministic tensors and labels, step counts, resume, in-order prefetch.
#include <gtest/gtest.h>

#include <algorithm>

#include "data/loader.h"
#include "nn/error.h"
#include "tests/data_u8_check.h"

namespace rt::data {
namespace {

DataConfig synthetic_config(int64_t samples, int threads) {
  DataConfig cfg;
  cfg.synthetic = true;
  cfg.synthetic_samples = samples;
  cfg.synthetic_classes = 7;
  cfg.image_size = 8;
  cfg.threads = threads;
  cfg.queue_depth = 2;
  cfg.seed = 11;
  return cfg;
}

std::vector<Batch> run_epoch(Loader& l, Position from) {
  l.start_epoch(from);
  std::vector<Batch> out;
  Batch b;
  while (l.next(b)) out.push_back(b);
  return out;
}

TEST(data_synthetic, StepsAndShapes) {
  auto l = make_loader(synthetic_config(103, 2), Split::train, 1, 3, 5);
  EXPECT_EQ(l->size(), 103);
  EXPECT_EQ(l->num_classes(), 7);
  EXPECT_EQ(l->steps_per_epoch(), 103 / 15);
  const std::vector<Batch> e = run_epoch(*l, {0, 0});
  ASSERT_EQ(static_cast<int64_t>(e.size()), l->steps_per_epoch());
  for (const Batch& b : e) {
    EXPECT_EQ(b.n, 5);
    EXPECT_EQ(b.images.size(), 5u * 3 * 8 * 8);
    for (int32_t y : b.labels) EXPECT_TRUE(y >= 0 && y < 7);
  }
  EXPECT_EQ(l->position().step, l->steps_per_epoch());
}

TEST(data_synthetic, DeterministicAcrossThreadCountsAndResume) {
  auto a = make_loader(synthetic_config(64, 1), Split::train, 0, 2, 4);
  auto b = make_loader(synthetic_config(64, 3), Split::train, 0, 2, 4);
  const std::vector<Batch> ea = run_epoch(*a, {2, 0}), eb = run_epoch(*b, {2, 0});
  ASSERT_EQ(ea.size(), eb.size());
  for (size_t s = 0; s < ea.size(); ++s) {
    EXPECT_EQ(ea[s].images, eb[s].images);
    EXPECT_EQ(ea[s].labels, eb[s].labels);
  }
  const std::vector<Batch> rest = run_epoch(*b, {2, 5});
  ASSERT_EQ(rest.size(), ea.size() - 5);
  for (size_t s = 0; s < rest.size(); ++s) EXPECT_EQ(rest[s].images, ea[s + 5].images);
  const std::vector<Batch> other = run_epoch(*a, {3, 0});
  EXPECT_NE(other[0].indices, ea[0].indices);
}

// Validation is not training's first epoch again: sample i has another image (and, across the
// split, other labels), or it would score what the model memorised.
TEST(data_synthetic, ValidationSamplesAreNotTrainingOnes) {
  auto train = make_loader(synthetic_config(64, 1), Split::train, 0, 1, 64);
  auto val = make_loader(synthetic_config(64, 1), Split::val, 0, 1, 64);
  const std::vector<Batch> t = run_epoch(*train, {0, 0}), v = run_epoch(*val, {0, 0});
  ASSERT_EQ(t.size(), 1u);
  ASSERT_EQ(v.size(), 1u);
  const size_t per = 3 * 8 * 8;
  int same_image = 0, same_label = 0;
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 64; ++j) {
      if (t[0].indices[size_t(i)] != v[0].indices[size_t(j)]) continue;  // the same sample index
      same_image += std::equal(t[0].images.begin() + long(per * i), t[0].images.begin() + long(per * (i + 1)),
                               v[0].images.begin() + long(per * j));
      same_label += t[0].labels[size_t(i)] == v[0].labels[size_t(j)];
    }
  EXPECT_EQ(same_image, 0);
  EXPECT_LT(same_label, 24);  // 1 in 7 by chance: about 9 of 64
}

TEST(data_synthetic, EightBitOutputNormalizesToTheFloats) {
  test::expect_u8_normalizes_to_floats(synthetic_config(64, 2), Split::train, 1, 2, 4);
  test::expect_u8_normalizes_to_floats(synthetic_config(37, 3), Split::val, 0, 2, 5, 0);
}

TEST(data_synthetic, FewerSamplesThanRanksIsAnErrorInTraining) {
  EXPECT_THROW(make_loader(synthetic_config(2, 1), Split::train, 0, 3, 1), Error);
  // Evaluation: the rank past the last sample evaluates none.
  EXPECT_NO_THROW(make_loader(synthetic_config(2, 1), Split::val, 2, 3, 4));
}

}  // namespace
}  // namespace rt::data
