// The cuDNN algorithm choice policy, on the host.
#include <gtest/gtest.h>

#include "cuda/algo_pick.h"

namespace rt::cuda {
namespace {

using Order = std::vector<int>;

TEST(CudaAlgoPick, RankedThatSucceedAndFitInRankOrder) {
  const std::vector<AlgoCandidate> c = {{6, false, 0, true},      // failed
                                        {1, true, 2000, true},    // too much workspace
                                        {0, true, 100, false},    // not deterministic
                                        {2, true, 500, true}};
  EXPECT_EQ(algo_order(c, 1000, false), (Order{2, 3}));
  EXPECT_EQ(algo_order(c, 1000, true), (Order{3}));
  EXPECT_EQ(algo_order(c, 5000, false), (Order{1, 2, 3}));
  EXPECT_EQ(algo_order(c, 10, true), Order{});
  EXPECT_EQ(algo_order({}, 1000, false), Order{});
  EXPECT_EQ(algo_order({{3, true, 0, false}}, 0, false), (Order{0}));  // zero fits a zero limit
}

// An fp32 layer without TF32 runs every candidate in FMA math: cuDNN's timings of its TF32
// variants (CUDNN_DEFAULT_MATH) rank them, not their FMA speed, so they come after those timed in
// FMA math, each group in rank order, and stay candidates.
TEST(CudaAlgoPick, RankedUnderAnotherMathTypeComeLast) {
  const std::vector<AlgoCandidate> c = {{1, true, 100, true, true},   // fastest in TF32
                                        {6, true, 100, true, false},  // fastest in FMA
                                        {0, true, 100, true, true},
                                        {1, true, 100, true, false},  // algorithm 1 timed in FMA
                                        {7, true, 5000, true, true}};  // too much workspace
  EXPECT_EQ(algo_order(c, 1000, false), (Order{1, 3, 0, 2}));
  const std::vector<AlgoCandidate> all_other = {{1, true, 100, true, true}, {0, true, 100, true, true}};
  EXPECT_EQ(algo_order(all_other, 1000, false), (Order{0, 1}));
}

}  // namespace
}  // namespace rt::cuda
