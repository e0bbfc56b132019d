// The flat arena: backward-order layout, alignment, state initialisation.
#include "nn/arena.h"

#include <gtest/gtest.h>

#include "nn/error.h"

namespace rt {
namespace {

TEST(Arena, LaysOutParametersInBackwardOrderAligned) {
  Arena<float> a;
  int w1 = a.add_param("conv1.weight", {4, 3, 3, 3}, ParamKind::conv_weight);
  int g1 = a.add_param("bn1.weight", {4}, ParamKind::bn_gamma);
  int fc = a.add_param("fc.weight", {10, 4}, ParamKind::linear_weight);
  int rm = a.add_state("bn1.running_var", 4, 1.0f);
  a.finalize();
  // Registered last -> produced first by backward -> offset 0.
  EXPECT_EQ(a.info(fc).offset, 0u);
  EXPECT_EQ(a.info(g1).offset, 48u);  // 40 rounded up to 16 floats
  EXPECT_EQ(a.info(w1).offset, 64u);
  EXPECT_EQ(a.param_count(), 108u + 4 + 40);
  ASSERT_EQ(a.layout().size(), 3u);
  EXPECT_EQ(a.layout()[0].name, "fc.weight");
  EXPECT_EQ(a.layout()[2].name, "conv1.weight");
  for (auto& p : a.layout()) EXPECT_EQ(p.offset % 16, 0u);
  EXPECT_EQ(a.grad(w1) - a.grads().data(), 64);
  EXPECT_EQ(a.state_ptr(rm)[3], 1.0f);
  EXPECT_THROW(a.add_param("late", {1}, ParamKind::bias), Error);
}

}  // namespace
}  // namespace rt
