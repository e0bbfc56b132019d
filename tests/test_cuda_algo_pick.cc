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

}  // namespace
}  // namespace rt::cuda
