// GPU smoke test (label gpu): skips, saying why, when no GPU is present.
#include <gtest/gtest.h>

#include <vector>

#include "tests/gpu/gpu_test_util.h"

TEST(Gpu, SaxpyMatchesHost) {
  RT_REQUIRE_GPU();
  std::vector<float> x(1000), y(1000);
  for (int i = 0; i < 1000; ++i) x[i] = float(i), y[i] = 1.0f;
  rt::cuda::saxpy_host(1000, 2.0f, x.data(), y.data());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(y[i], 2.0f * i + 1.0f) << "at " << i;
}
