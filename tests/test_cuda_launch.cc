// Host-side arithmetic of the CUDA backend (no GPU, no CUDA headers): launch splitting, grid
// sizes, vector widths and tails, the device SGD's segment list.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "cuda/launch.h"
#include "cuda/sgd_plan.h"

namespace rt::cuda {
namespace {

// Every element covered exactly once, in order, each launch within the 32-bit index budget.
void expect_partition(const std::vector<LaunchRange>& r, size_t n, size_t max) {
  size_t next = 0;
  for (const LaunchRange& x : r) {
    EXPECT_EQ(x.offset, next);
    EXPECT_GE(x.count, 1u);
    EXPECT_LE(x.count, max);
    next += x.count;
  }
  EXPECT_EQ(next, n);
}

TEST(CudaLaunch, SplitCoversEveryCountExactlyOnce) {
  EXPECT_TRUE(split_launches(0).empty());
  for (size_t n : {size_t{1}, size_t{255}, size_t{256}, kMaxLaunchElems - 1, kMaxLaunchElems,
                   kMaxLaunchElems + 1}) {
    expect_partition(split_launches(n), n, kMaxLaunchElems);
  }
}

TEST(CudaLaunch, CountsBeyondTwoToThe31AreSplit) {
  const size_t n = (size_t{1} << 31) + 7;  // more than int32 can count
  const auto r = split_launches(n);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0], (LaunchRange{0, kMaxLaunchElems}));
  EXPECT_EQ(r[1], (LaunchRange{kMaxLaunchElems, kMaxLaunchElems}));
  EXPECT_EQ(r[2], (LaunchRange{2 * kMaxLaunchElems, 7}));
  expect_partition(split_launches(size_t{5} << 32), size_t{5} << 32, kMaxLaunchElems);
  // Index + grid stride stays below 2^32 inside any launch.
  EXPECT_LT(uint64_t(kMaxLaunchElems) + uint64_t(kMaxBlocks) * kThreads, uint64_t{1} << 32);
  // Every launch after the first keeps 16-byte vector alignment for any element size.
  EXPECT_EQ(kMaxLaunchElems % kVecBytes, 0u);
}

TEST(CudaLaunch, SplitWithSmallLimit) {
  const auto r = split_launches(10, 4);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[2], (LaunchRange{8, 2}));
  EXPECT_TRUE(split_launches(10, 0).empty());
}

TEST(CudaLaunch, GridSizes) {
  EXPECT_EQ(grid_for(0), 1u);  // an empty vector part still launches a valid grid (for the tail)
  EXPECT_EQ(grid_for(1), 1u);
  EXPECT_EQ(grid_for(256), 1u);
  EXPECT_EQ(grid_for(257), 2u);
  EXPECT_EQ(grid_for(size_t{1} << 40), kMaxBlocks);  // capped: grid-stride loops do the rest
  EXPECT_EQ(grid_for(1000, 100, 5), 5u);
}

TEST(CudaLaunch, VectorWidthNeedsEveryPointerAligned) {
  alignas(16) static float buf[16];
  EXPECT_EQ(vec_width(4, {buf, buf + 4}), 4);
  EXPECT_EQ(vec_width(2, {buf}), 8);
  EXPECT_EQ(vec_width(4, {buf, buf + 1}), 1);  // a ring chunk at an odd offset
  EXPECT_EQ(vec_width(4, {buf + 2}), 1);
  EXPECT_EQ(vec_width(4, {buf, nullptr}), 4);  // no source: only dst matters
}

TEST(CudaLaunch, WholeVectorsNeedNoTailAndAlignment) {
  alignas(16) static uint16_t buf[32];
  EXPECT_TRUE(whole_vectors(16, 2, {buf, buf + 8}));
  EXPECT_FALSE(whole_vectors(12, 2, {buf}));         // a tail of 4
  EXPECT_FALSE(whole_vectors(16, 2, {buf, buf + 1}));  // misaligned
  EXPECT_TRUE(whole_vectors(8, 4, {buf, nullptr}));   // fp32: 4 per vector
  EXPECT_FALSE(whole_vectors(6, 4, {buf}));
  EXPECT_TRUE(whole_vectors(0, 2, {buf}));
}

TEST(CudaLaunch, VectorTails) {
  for (int w : {1, 4, 8})
    for (size_t n : {0, 1, 3, 7, 8, 9, 1001}) {
      const VecSplit s = vec_split(n, w);
      EXPECT_EQ(s.vectors * size_t(w) + s.tail, n);
      EXPECT_LT(s.tail, size_t(w));
    }
  EXPECT_EQ(vec_split(1001, 8).tail, 1u);
  // The tail (< 8 elements) is handled by the first threads of the grid: one block suffices.
  EXPECT_LE(size_t(8), size_t(kThreads));
}

// Runs map_launch's plan (launches, vector split, grid) and every thread's map_thread on the host,
// counting visits per element: each of the n elements must be visited exactly once, and vector
// visits must cover whole vectors inside the launch.
void expect_each_element_once(size_t n, int width, size_t max_elems, uint32_t max_blocks) {
  std::vector<uint8_t> visits(n, 0);
  for (const LaunchRange& r : split_launches(n, max_elems)) {
    const VecSplit s = vec_split(r.count, width);
    const uint32_t grid = grid_for(s.vectors, kThreads, max_blocks);
    const uint32_t stride = grid * uint32_t(kThreads);
    for (uint32_t t = 0; t < stride; ++t)
      map_thread(
          t, stride, uint32_t(s.vectors), uint32_t(width), uint32_t(r.count),
          [&](uint32_t v) {
            for (int k = 0; k < width; ++k) {
              const size_t i = r.offset + size_t(v) * size_t(width) + size_t(k);
              ASSERT_LT(i, r.offset + r.count) << "vector past its launch";
              ++visits[i];
            }
          },
          [&](uint32_t i) {
            ASSERT_GE(i, s.vectors * size_t(width)) << "scalar visit inside the vector part";
            ++visits[r.offset + i];
          });
  }
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(visits[i], 1) << "element " << i << " of " << n << ", width " << width
                            << ", launches of " << max_elems << ", " << max_blocks << " blocks";
}

TEST(CudaLaunch, EveryThreadOfEveryLaunchTogetherVisitEachElementOnce) {
  for (int width : {1, 4, 8})
    for (size_t n : {0, 1, 7, 8, 9, 255, 256, 257, 1000, 4099, 70001}) {
      expect_each_element_once(n, width, kMaxLaunchElems, kMaxBlocks);
      expect_each_element_once(n, width, 4096, 3);  // many launches, grid-stride loops
      expect_each_element_once(n, width, 1001, 1);  // a vector tail in every launch
    }
}

std::vector<ParamInfo> layout_of(std::vector<std::pair<ParamKind, size_t>> tensors) {
  std::vector<ParamInfo> l;
  size_t off = 0;
  for (auto [kind, count] : tensors) {
    ParamInfo p;
    p.name = "t" + std::to_string(l.size());
    p.kind = kind;
    p.offset = off;
    p.count = count;
    l.push_back(p);
    off += (count + 15) / 16 * 16;  // 64-byte aligned, as the arena lays tensors out
  }
  return l;
}

TEST(CudaSgdPlan, SegmentsCoverEachTensorAndNoPadding) {
  const auto layout = layout_of({{ParamKind::conv_weight, 10000},
                                 {ParamKind::bn_gamma, 3},
                                 {ParamKind::bn_beta, 3},
                                 {ParamKind::linear_weight, 4096},
                                 {ParamKind::bias, 17}});
  SgdConfig cfg;
  cfg.weight_decay = 5e-4;
  cfg.decay_bn_and_bias = false;
  const auto segs = sgd_segments(layout, cfg);
  ASSERT_EQ(segs.size(), 3u + 1 + 1 + 1 + 1);  // 10000 = 4096 + 4096 + 1808
  EXPECT_EQ(segs[0].begin, 0u);
  EXPECT_EQ(segs[1].begin, 4096u);
  EXPECT_EQ(segs[2].count, 1808u);
  size_t covered = 0;
  for (const SgdSegment& s : segs) {
    covered += s.count;
    EXPECT_LE(s.count, kSgdSegmentElems);
    EXPECT_GE(s.count, 1u);
  }
  EXPECT_EQ(covered, 10000u + 3 + 3 + 4096 + 17);
  EXPECT_EQ(segs[3].begin, layout[1].offset);  // padding between tensors is in no segment
  // Weight decay follows Sgd: cast to float, zero for BN and bias when they are excluded.
  EXPECT_EQ(segs[0].weight_decay, float(5e-4));
  EXPECT_EQ(segs[3].weight_decay, 0.0f);
  EXPECT_EQ(segs[4].weight_decay, 0.0f);
  EXPECT_EQ(segs[5].weight_decay, float(5e-4));
  EXPECT_EQ(segs[6].weight_decay, 0.0f);
  cfg.decay_bn_and_bias = true;
  for (const SgdSegment& s : sgd_segments(layout, cfg)) EXPECT_EQ(s.weight_decay, float(5e-4));
}

TEST(CudaSgdPlan, MomentumBufferMatchesTheCpuOptimizer) {
  const auto layout = layout_of({{ParamKind::conv_weight, 100}, {ParamKind::bias, 5}});
  SgdConfig cfg;
  Sgd<float> cpu(layout, cfg);
  EXPECT_EQ(sgd_buffer_elems(layout), cpu.size());
}

TEST(CudaSgdPlan, RefusesWhatTheDeviceStepCannotDo) {
  const auto layout = layout_of({{ParamKind::conv_weight, 100}});
  SgdConfig cfg;
  cfg.nesterov = true;
  cfg.momentum = 0;
  EXPECT_THROW(sgd_segments(layout, cfg), Error);  // as sgd_validate
  cfg = SgdConfig{};
  auto bad = layout_of({{ParamKind::conv_weight, 100}, {ParamKind::bias, 5}});
  bad[1].offset = 50;  // overlaps the first tensor
  EXPECT_THROW(sgd_segments(bad, cfg), Error);
  EXPECT_TRUE(sgd_segments({}, cfg).empty());
}

TEST(CudaSgdPlan, LarsTensorsAreTheCpuOptimizersWithTheirSegments) {
  const auto layout = layout_of({{ParamKind::conv_weight, 10000},
                                 {ParamKind::bn_gamma, 3},
                                 {ParamKind::linear_weight, 4096},
                                 {ParamKind::bias, 17}});
  SgdConfig cfg;
  cfg.weight_decay = 1e-4;
  EXPECT_TRUE(lars_tensors(layout, cfg).empty());  // no LARS
  cfg.lars = true;
  auto t = lars_tensors(layout, cfg);
  ASSERT_EQ(t.size(), 2u);  // BN and bias excluded
  EXPECT_EQ(t[0].first_segment, 0u);
  EXPECT_EQ(t[0].num_segments, 3u);
  EXPECT_EQ(t[1].first_segment, 4u);  // after the BN tensor's one segment
  EXPECT_EQ(t[1].num_segments, 1u);
  EXPECT_EQ(t[1].weight_decay, float(1e-4));
  cfg.lars_exclude_bn_and_bias = false;
  cfg.decay_bn_and_bias = false;
  t = lars_tensors(layout, cfg);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[3].first_segment, 5u);
  EXPECT_EQ(t[3].weight_decay, 0.0f);
}

// optimizer.freeze: a frozen tensor has no segment and is no LARS tensor, and the LARS tensors
// after it index the segments that remain (their offsets are their own tensors').
TEST(CudaSgdPlan, FrozenTensorsHaveNoSegments) {
  auto layout = layout_of({{ParamKind::conv_weight, 10000},
                           {ParamKind::conv_weight, 5000},
                           {ParamKind::linear_weight, 4096},
                           {ParamKind::bias, 17}});
  layout[1].name = "layer1.0.conv1.weight";
  SgdConfig cfg;
  cfg.lars = true;
  cfg.freeze = {"layer1"};
  const auto segs = sgd_segments(layout, cfg);
  ASSERT_EQ(segs.size(), 3u + 1 + 1);
  for (const SgdSegment& s : segs)
    EXPECT_TRUE(s.begin + s.count <= layout[1].offset || s.begin >= layout[2].offset) << s.begin;
  const auto t = lars_tensors(layout, cfg);
  ASSERT_EQ(t.size(), 2u);  // the bias excluded, the frozen tensor too
  EXPECT_EQ(t[1].first_segment, 3u);
  EXPECT_EQ(segs[t[1].first_segment].begin, layout[2].offset);
}

// The device's segments, each summed as the CPU sums a chunk (lars_chunk_squares, which
// gpu_sgd holds the kernel to), added per tensor and turned into a ratio by cuda/lars.h's
// arithmetic on the host, give the CPU optimizer's trust ratios bit for bit. The ratios are
// compared in double, where a different order of the sums shows (rounded to float, as the update
// uses them, it mostly would not).
TEST(CudaSgdPlan, LarsArithmeticEqualsTheCpuOptimizer) {
  const auto layout = layout_of({{ParamKind::conv_weight, 10000},
                                 {ParamKind::bn_gamma, 64},
                                 {ParamKind::conv_weight, 4096},
                                 {ParamKind::conv_weight, 300},  // all zero: the factor is 1
                                 {ParamKind::linear_weight, 4097}});
  for (bool exclude : {true, false}) {
    SgdConfig cfg;
    cfg.lars = true;
    cfg.weight_decay = 5e-4;
    cfg.lars_exclude_bn_and_bias = exclude;
    Sgd<float> cpu(layout, cfg);
    std::vector<float> p(cpu.size()), g(cpu.size());
    std::mt19937 rng(3);
    std::normal_distribution<float> d(0, 1);
    for (size_t i = 0; i < p.size(); ++i) p[i] = d(rng), g[i] = 0.01f * d(rng);
    for (size_t i = layout[3].offset; i < layout[3].offset + 300; ++i) p[i] = 0;
    const std::vector<float> p0 = p;
    cpu.step(p.data(), g.data(), 0.1);

    const auto segs = sgd_segments(layout, cfg);
    std::vector<float> scale(segs.size(), 1.0f);
    std::vector<double> ratio(segs.size(), 1.0);
    for (const LarsTensor& t : lars_tensors(layout, cfg)) {
      double w2 = 0, g2 = 0;
      for (uint32_t j = t.first_segment; j < t.first_segment + t.num_segments; ++j) {
        double sw = 0, sg = 0;
        lars_chunk_squares(p0.data() + segs[j].begin, g.data() + segs[j].begin, segs[j].count, &sw, &sg);
        w2 = lars_add(w2, sw);
        g2 = lars_add(g2, sg);
      }
      const float s = lars_scale(w2, g2, t.weight_decay, cfg.lars_trust, cfg.lars_eps);
      const double r = lars_ratio(w2, g2, t.weight_decay, cfg.lars_trust, cfg.lars_eps);
      for (uint32_t j = t.first_segment; j < t.first_segment + t.num_segments; ++j)
        scale[j] = s, ratio[j] = r;
    }
    // Each tensor's factor, read off its first segment, against the CPU's: in double, and
    // rounded as the update uses it.
    size_t seg = 0;
    for (size_t k = 0; k < layout.size(); ++k) {
      EXPECT_EQ(ratio[seg], cpu.trust_ratios()[k]) << "tensor " << k << " exclude " << exclude;
      EXPECT_EQ(scale[seg], float(cpu.trust_ratios()[k])) << "tensor " << k << " exclude " << exclude;
      seg += (layout[k].count + kSgdSegmentElems - 1) / kSgdSegmentElems;
    }
    EXPECT_EQ(scale[5], 1.0f);                // the zero tensor: segments 0-2, 3, 4, then it
    EXPECT_NE(cpu.trust_ratios()[0], 1.0);    // LARS did scale the first tensor
  }
}

}  // namespace
}  // namespace rt::cuda
