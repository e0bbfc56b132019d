// LossScaler's bookkeeping: growth after a run of good steps, back-off and skip on overflow, the
// floor that turns persistent non-finite gradients into an error, static and disabled modes,
// restore, and validation naming the field.
#include <gtest/gtest.h>

#include "nn/error.h"
#include "nn/loss_scale.h"

namespace rt {
namespace {

LossScaleConfig dynamic(double init, int64_t interval) {
  LossScaleConfig c;
  c.mode = "dynamic";
  c.init = init;
  c.growth_interval = interval;
  return c;
}

TEST(LossScaler, GrowsAfterIntervalAndBacksOffOnOverflow) {
  LossScaler s(dynamic(1024, 3));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(false));  // third good step in a row
  EXPECT_EQ(s.scale(), 2048);
  EXPECT_EQ(s.good_steps(), 0);
  EXPECT_TRUE(s.update(false));
  EXPECT_FALSE(s.update(true));  // overflow: skip, halve, restart the count
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.good_steps(), 0);
  EXPECT_EQ(s.skipped_steps(), 1);
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 1024);  // the interval counts from the overflow
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 2048);
}

TEST(LossScaler, PersistentOverflowBelowMinIsAnError) {
  LossScaleConfig c = dynamic(8, 100);
  c.min = 2;
  LossScaler s(c);
  EXPECT_FALSE(s.update(true));  // 4
  EXPECT_FALSE(s.update(true));  // 2
  try {
    s.update(true);
    FAIL() << "no error below loss_scale.min";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("loss_scale.min"), std::string::npos) << e.what();
  }
}

TEST(LossScaler, StaticAndNoneNeverSkip) {
  LossScaleConfig c;
  LossScaler none(c);
  EXPECT_FALSE(none.enabled());
  EXPECT_EQ(none.scale(), 1);
  EXPECT_TRUE(none.update(true));
  c.mode = "static";
  c.init = 512;
  LossScaler fixed(c);
  EXPECT_TRUE(fixed.enabled());
  EXPECT_FALSE(fixed.dynamic());
  for (int i = 0; i < 5000; ++i) EXPECT_TRUE(fixed.update(i % 7 == 0));
  EXPECT_EQ(fixed.scale(), 512);
  EXPECT_EQ(fixed.skipped_steps(), 0);
}

TEST(LossScaler, RestoreKeepsInitWhenNothingWasSaved) {
  LossScaler s(dynamic(65536, 10));
  s.restore(0, 0);  // a checkpoint written without loss scaling
  EXPECT_EQ(s.scale(), 65536);
  s.restore(256, 7);
  EXPECT_EQ(s.scale(), 256);
  EXPECT_EQ(s.good_steps(), 7);
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 512);
}

TEST(LossScaler, RestoreLeavesAStaticScaleAsConfigured) {
  LossScaleConfig c;
  c.mode = "static";
  c.init = 128;
  LossScaler s(c);
  s.restore(32768, 5);  // a dynamic run's file, or a static one's with another init
  EXPECT_EQ(s.scale(), 128);
}

TEST(LossScaler, ValidationNamesTheField) {
  auto message = [](LossScaleConfig c) {
    try {
      loss_scale_validate(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  LossScaleConfig c;
  c.mode = "auto";
  EXPECT_NE(message(c).find("mode must be none, static or dynamic"), std::string::npos);
  c = dynamic(0, 1);
  EXPECT_NE(message(c).find("init"), std::string::npos);
  c = dynamic(8, 0);
  EXPECT_NE(message(c).find("growth_interval"), std::string::npos);
  c = dynamic(8, 1);
  c.backoff_factor = 1;
  EXPECT_NE(message(c).find("backoff_factor"), std::string::npos);
  c = dynamic(8, 1);
  c.min = 16;
  EXPECT_NE(message(c).find("min"), std::string::npos);
  EXPECT_EQ(message(dynamic(8, 1)), "");
}

}  // namespace
}  // namespace rt
