// Shared by the reference layers' tests (test_ref_layers.cc, test_ref_conv.cc): the double
// reference backend in a fixture and an elementwise comparison.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "nn/ops.h"
#include "nn/ref/ref_backend.h"

namespace rt::test {

using Vec = std::vector<double>;

inline void expect_near_all(const Vec& got, const Vec& want, double tol = 1e-12) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

class RefLayers : public ::testing::Test {
 protected:
  std::unique_ptr<Backend<double>> be_ = make_reference_backend<double>();
};

}  // namespace rt::test
