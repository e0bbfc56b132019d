// The cuDNN algorithm choice policy, on the host.
#include <gtest/gtest.h>

#include "cuda/algo_pick.h"

namespace rt::cuda {
namespace {

TEST(CudaAlgoPick, FirstRankedThatSucceedsAndFits) {
  const std::vector<AlgoCandidate> c = {{6, false, 0, true},      // failed
                                        {1, true, 2000, true},    // too much workspace
                                        {0, true, 100, false},    // not deterministic
                                        {2, true, 500, true}};
  EXPECT_EQ(algo_pick(c, 1000, false), 2);
  EXPECT_EQ(algo_pick(c, 1000, true), 3);
  EXPECT_EQ(algo_pick(c, 5000, false), 1);
  EXPECT_EQ(algo_pick(c, 10, true), -1);
  EXPECT_EQ(algo_pick({}, 1000, false), -1);
  EXPECT_EQ(algo_pick({{3, true, 0, false}}, 0, false), 0);  // zero workspace fits a zero limit
}

}  // namespace
}  // namespace rt::cuda
