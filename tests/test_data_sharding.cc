// Sharding as plain integers: disjoint, covering, equal training step counts, exactly-once
// evaluation, deterministic per seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <set>
#include <vector>

#include "data/sharding.h"
#include "nn/error.h"

namespace rt::data {
namespace {

// Every batch of every rank in one epoch.
std::vector<std::vector<std::vector<int64_t>>> all_batches(const ShardSpec& spec, int64_t epoch) {
  std::vector<std::vector<std::vector<int64_t>>> out(static_cast<size_t>(spec.world));
  for (int r = 0; r < spec.world; ++r)
    for (int64_t s = 0; s < steps_per_epoch(spec, r); ++s)
      out[static_cast<size_t>(r)].push_back(batch_indices(spec, r, epoch, s));
  return out;
}

TEST(data_sharding, TrainDisjointEqualStepsFullBatches) {
  for (int world : {1, 2, 3, 5, 7})
    for (int64_t n : {7, 8, 9, 33, 100, 257})
      for (int batch : {1, 4, 16}) {
        ShardSpec spec{n, world, batch, true, 42};
        if (n < world) continue;
        const auto b = all_batches(spec, 3);
        const int64_t steps = n / (int64_t{world} * batch);
        std::set<int64_t> seen;
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(static_cast<int64_t>(b[r].size()), steps) << "n=" << n << " world=" << world;
          for (const auto& batch_ix : b[r]) {
            ASSERT_EQ(static_cast<int>(batch_ix.size()), batch);
            for (int64_t i : batch_ix) {
              ASSERT_TRUE(i >= 0 && i < n);
              ASSERT_TRUE(seen.insert(i).second) << "sample " << i << " on two ranks or twice";
            }
          }
        }
        // Only the ragged tail is dropped: fewer than world * batch samples.
        EXPECT_EQ(static_cast<int64_t>(seen.size()), steps * world * batch);
        EXPECT_LT(n - static_cast<int64_t>(seen.size()), int64_t{world} * batch);
      }
}

// What lets a checkpoint resume on another rank count at the same global batch: optimizer step s
// of an epoch (ranks x batch x passes images, p batches a rank) takes the same samples for every
// such split, the global batch's block of the epoch's permutation, and an epoch has as many steps.
TEST(data_sharding, GlobalStepsTakeTheSameSamplesOnAnyRankCount) {
  struct Split {
    int world, batch, passes;
  };
  const Split splits[] = {{1, 12, 1}, {12, 1, 1}, {2, 6, 1}, {3, 4, 1}, {2, 3, 2}, {1, 4, 3}, {4, 1, 3}, {6, 1, 2}};
  for (int64_t n : {12, 47, 48, 61}) {
    const std::vector<int64_t> order = epoch_order(9, 2, n, true);
    for (const Split& sp : splits) {
      const ShardSpec spec{n, sp.world, sp.batch, true, 9};
      const auto b = all_batches(spec, 2);
      for (int r = 0; r < sp.world; ++r)
        ASSERT_EQ(int64_t(b[size_t(r)].size()) / sp.passes, n / 12) << "n=" << n << " world=" << sp.world;
      for (int64_t s = 0; s < n / 12; ++s) {
        std::vector<int64_t> got, want(order.begin() + s * 12, order.begin() + (s + 1) * 12);
        for (int r = 0; r < sp.world; ++r)
          for (int64_t k = s * sp.passes; k < (s + 1) * sp.passes; ++k)
            got.insert(got.end(), b[size_t(r)][size_t(k)].begin(), b[size_t(r)][size_t(k)].end());
        std::sort(got.begin(), got.end());
        std::sort(want.begin(), want.end());
        ASSERT_EQ(got, want) << "n=" << n << " " << sp.world << " x " << sp.batch << " x " << sp.passes << " step " << s;
      }
    }
  }
}

TEST(data_sharding, EvalVisitsEverySampleExactlyOnce) {
  for (int world : {1, 2, 3, 5, 7})
    for (int64_t n : {7, 8, 9, 10, 33, 100, 257})
      for (int batch : {1, 4, 16, 300}) {
        if (n < world) continue;
        ShardSpec spec{n, world, batch, false, 42};
        const auto b = all_batches(spec, 0);
        std::vector<int> count(static_cast<size_t>(n), 0);
        int64_t min_steps = INT64_MAX, max_steps = 0;
        for (int r = 0; r < world; ++r) {
          const int64_t steps = static_cast<int64_t>(b[r].size());
          min_steps = std::min(min_steps, steps), max_steps = std::max(max_steps, steps);
          for (size_t s = 0; s < b[r].size(); ++s) {
            ASSERT_FALSE(b[r][s].empty());
            if (s + 1 < b[r].size()) {  // only the last is short
              ASSERT_EQ(static_cast<int>(b[r][s].size()), batch);
            }
            for (int64_t i : b[r][s]) ++count[static_cast<size_t>(i)];
          }
        }
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(count[static_cast<size_t>(i)], 1) << "sample " << i;
        EXPECT_LE(max_steps - min_steps, 1);
      }
}

TEST(data_sharding, OrderIsAPermutationDeterministicPerSeedAndEpoch) {
  const auto a = epoch_order(5, 2, 1000, true);
  EXPECT_EQ(a, epoch_order(5, 2, 1000, true));
  EXPECT_NE(a, epoch_order(6, 2, 1000, true));
  EXPECT_NE(a, epoch_order(5, 3, 1000, true));
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[static_cast<size_t>(i)], i);
  const auto id = epoch_order(5, 2, 10, false);
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(id[static_cast<size_t>(i)], i);
}

// A uniform shuffle (Fisher-Yates: j drawn from [0, i], i itself included): over many epochs every
// order of three samples comes up, about equally often. Drawing j from [0, i) instead (Sattolo's
// algorithm) still gives permutations, but only the cyclic ones: no sample ever keeps its place.
TEST(data_sharding, ShuffleReachesEveryOrder) {
  std::map<std::vector<int64_t>, int> seen;
  const int epochs = 600;
  for (int64_t e = 0; e < epochs; ++e) ++seen[epoch_order(11, e, 3, true)];
  EXPECT_EQ(seen.size(), 6u);
  for (const auto& [order, n] : seen)
    EXPECT_GT(n, epochs / 6 / 2) << order[0] << order[1] << order[2] << " came up " << n << " times";
  int fixed = 0;  // samples left where they were, over 100 epochs of 50: about 100 expected
  for (int64_t e = 0; e < 100; ++e) {
    const auto o = epoch_order(3, e, 50, true);
    for (int64_t i = 0; i < 50; ++i) fixed += o[size_t(i)] == i;
  }
  EXPECT_GT(fixed, 50);
}

TEST(data_sharding, AllRanksShareOnePermutation) {
  // Rank r's k-th sample is position k * world + r of the same epoch order on every rank.
  ShardSpec spec{50, 3, 4, true, 9};
  const auto order = epoch_order(9, 1, 50, true);
  for (int r = 0; r < 3; ++r) {
    const EpochShare share(spec, r, 1);
    for (int64_t k = 0; k < share.size(); ++k) EXPECT_EQ(share.sample(k), order[static_cast<size_t>(k * 3 + r)]);
  }
}

// Repeated augmentation: each drawn sample m times an epoch, its copies on m different ranks
// (m <= world) with copy numbers 0..m-1, the first n / m entries of the epoch's permutation drawn
// in order, and shares, steps and batches as without it.
TEST(data_sharding, RepeatedAugmentationDrawsEachSampleOnDifferentRanks) {
  for (int world : {1, 2, 4, 8})
    for (int reps : {1, 2, 3, 4})
      for (int64_t n : {64, 100, 257}) {
        const ShardSpec spec{n, world, 4, true, 5, reps};
        const ShardSpec plain{n, world, 4, true, 5};
        const std::vector<int64_t> order = epoch_order(5, 1, n, true);
        std::map<int64_t, std::vector<std::pair<int, int>>> seen;  // sample -> (rank, copy)
        int64_t used = 0;
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(steps_per_epoch(spec, r), steps_per_epoch(plain, r));
          for (int64_t s = 0; s < steps_per_epoch(spec, r); ++s) {
            std::vector<int> copies;
            const std::vector<int64_t> ix = batch_indices(spec, r, 1, s, &copies);
            ASSERT_EQ(ix.size(), 4u);
            ASSERT_EQ(copies.size(), 4u);
            for (size_t j = 0; j < ix.size(); ++j) seen[ix[j]].push_back({r, copies[j]});
            used += int64_t(ix.size());
          }
        }
        const std::string at = "n=" + std::to_string(n) + " world=" + std::to_string(world) + " reps=" +
                               std::to_string(reps);
        // The drawn samples are a prefix of the permutation, in blocks of reps positions.
        const int64_t drawn = (used + reps - 1) / reps;
        ASSERT_EQ(int64_t(seen.size()), drawn) << at;
        for (int64_t q = 0; q < drawn; ++q) {
          const auto& c = seen[order[size_t(q)]];
          // Positions q*reps .. q*reps+reps-1, all used but perhaps the last block's tail.
          const int64_t want = std::min<int64_t>(reps, used - q * reps);
          ASSERT_EQ(int64_t(c.size()), want) << at << " sample " << order[size_t(q)];
          std::set<int> ranks, copy_ids;
          for (auto [rank, copy] : c) ranks.insert(rank), copy_ids.insert(copy);
          EXPECT_EQ(int64_t(copy_ids.size()), want) << at << ": a copy number twice";
          if (reps <= world) {
            EXPECT_EQ(int64_t(ranks.size()), want) << at << ": copies on one rank";
          }
        }
        if (reps == 1) {
          for (int r = 0; r < world; ++r)
            for (int64_t s = 0; s < steps_per_epoch(spec, r); ++s)
              ASSERT_EQ(batch_indices(spec, r, 1, s), batch_indices(plain, r, 1, s));
        }
      }
  EXPECT_THROW(shard_check({10, 2, 1, true, 0, 0}, 0), Error);
  EXPECT_THROW(shard_check({10, 2, 1, false, 0, 2}, 0), Error);  // evaluation is never repeated
}

TEST(data_sharding, StepCountsAndBadSpecs) {
  EXPECT_EQ(steps_per_epoch({100, 3, 8, true, 0}, 0), 100 / 24);
  EXPECT_EQ(steps_per_epoch({10, 3, 4, false, 0}, 0), 1);  // 0, 3, 6, 9
  EXPECT_EQ(steps_per_epoch({10, 3, 2, false, 0}, 0), 2);
  EXPECT_EQ(steps_per_epoch({10, 3, 2, false, 0}, 2), 2);  // 2, 5, 8
  EXPECT_THROW(shard_check({2, 3, 1, true, 0}, 0), Error);  // a training rank without a share
  // Evaluation of 2 samples on 3 ranks: rank 2's share is empty (no steps), not an error.
  EXPECT_NO_THROW(shard_check({2, 3, 1, false, 0}, 2));
  EXPECT_EQ(steps_per_epoch({2, 3, 1, false, 0}, 2), 0);
  EXPECT_THROW(shard_check({0, 3, 1, false, 0}, 0), Error);
  EXPECT_THROW(shard_check({10, 3, 1, false, 0}, 3), Error);
  EXPECT_THROW(shard_check({10, 3, 0, false, 0}, 0), Error);
  EXPECT_NO_THROW(shard_check({3, 3, 8, false, 0}, 2));
  // Repeated augmentation drawing fewer images an epoch than a global batch: the same few trained.
  EXPECT_THROW(shard_check({240, 2, 4, true, 0, 1000}, 0), Error);
  EXPECT_THROW(shard_check({240, 2, 4, true, 0, 31}, 0), Error);  // 7 images < 8
  EXPECT_NO_THROW(shard_check({240, 2, 4, true, 0, 30}, 0));     // 8 images
}

}  // namespace
}  // namespace rt::data
