// Learning-rate schedules: warm-up, step/multistep boundaries, cosine, poly and config errors.
#include "nn/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

#include "nn/error.h"

namespace rt {
namespace {

constexpr double kTol = 1e-12;

ScheduleConfig config(ScheduleKind kind) {
  ScheduleConfig c;
  c.kind = kind;
  return c;
}

// Expects lr_at (and schedule_validate) to throw rt::Error whose message contains `needle`.
void expect_error(const ScheduleConfig& cfg, const std::string& needle, double epoch = 0) {
  try {
    lr_at(cfg, epoch);
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Schedule, LinearWarmupRisesPerStep) {
  // Goyal et al.: 0.1 → 0.4 over 5 epochs.
  ScheduleConfig c = config(ScheduleKind::multistep);
  c.base_lr = 0.4;
  c.warmup_epochs = 5;
  c.warmup_start_factor = 0.25;
  EXPECT_NEAR(lr_at(c, 0), 0.1, kTol);
  EXPECT_NEAR(lr_at(c, 1.0 / 100), 0.1 + 0.3 * 0.01 / 5, kTol);  // step 1 of 100 per epoch
  EXPECT_NEAR(lr_at(c, 2.5), 0.25, kTol);
  EXPECT_NEAR(lr_at(c, 5), 0.4, kTol);
  EXPECT_NEAR(lr_at(c, 29.99), 0.4, kTol);
  // Milestones are absolute epochs, not counted from the end of warm-up.
  EXPECT_NEAR(lr_at(c, 30), 0.04, kTol);

  c.warmup_start_factor = 0;
  EXPECT_EQ(lr_at(c, 0), 0.0);
  EXPECT_NEAR(lr_at(c, 1), 0.08, kTol);
}

TEST(Schedule, ConstantIgnoresEpochAfterWarmup) {
  ScheduleConfig c = config(ScheduleKind::constant);
  c.base_lr = 0.2;
  c.warmup_epochs = 2;
  EXPECT_NEAR(lr_at(c, 1), 0.1, kTol);
  EXPECT_EQ(lr_at(c, 2), 0.2);
  EXPECT_EQ(lr_at(c, 1000), 0.2);
}

TEST(Schedule, StepDecaysAtEachBoundary) {
  ScheduleConfig c = config(ScheduleKind::step);  // base 0.1, step 30, gamma 0.1
  EXPECT_EQ(lr_at(c, 0), 0.1);
  EXPECT_EQ(lr_at(c, 29.999), 0.1);
  EXPECT_NEAR(lr_at(c, 30), 0.01, kTol);  // decayed at the boundary itself
  EXPECT_NEAR(lr_at(c, 59.999), 0.01, kTol);
  EXPECT_NEAR(lr_at(c, 60), 0.001, kTol);
  EXPECT_NEAR(lr_at(c, 89.9), 0.001, kTol);
  // e = step / steps_per_epoch lands exactly on the boundary.
  EXPECT_NEAR(lr_at(c, 30.0 * 5004 / 5004), 0.01, kTol);
}

TEST(Schedule, MultistepDecaysAtMilestones) {
  ScheduleConfig c = config(ScheduleKind::multistep);  // {30, 60, 80}
  EXPECT_EQ(lr_at(c, 29.99), 0.1);
  EXPECT_NEAR(lr_at(c, 30), 0.01, kTol);
  EXPECT_NEAR(lr_at(c, 59.99), 0.01, kTol);
  EXPECT_NEAR(lr_at(c, 60), 0.001, kTol);
  EXPECT_NEAR(lr_at(c, 79.99), 0.001, kTol);
  EXPECT_NEAR(lr_at(c, 80), 0.0001, kTol);
  EXPECT_NEAR(lr_at(c, 120), 0.0001, kTol);
  c.milestones = {};
  EXPECT_EQ(lr_at(c, 85), 0.1);
}

TEST(Schedule, CosineDecaysOverEpochsAfterWarmup) {
  ScheduleConfig c = config(ScheduleKind::cosine);
  c.base_lr = 1;
  c.warmup_epochs = 5;
  c.total_epochs = 85;  // decay over [5, 85]
  EXPECT_NEAR(lr_at(c, 2.5), 0.5, kTol);
  EXPECT_NEAR(lr_at(c, 5), 1, kTol);
  EXPECT_NEAR(lr_at(c, 25), (1 + std::cos(std::numbers::pi / 4)) / 2, kTol);
  EXPECT_NEAR(lr_at(c, 45), 0.5, kTol);  // midpoint
  EXPECT_NEAR(lr_at(c, 85), 0, kTol);
  EXPECT_NEAR(lr_at(c, 100), 0, kTol);

  c.final_lr = 0.1;
  EXPECT_NEAR(lr_at(c, 45), 0.55, kTol);
  EXPECT_NEAR(lr_at(c, 85), 0.1, kTol);
  EXPECT_NEAR(lr_at(c, 200), 0.1, kTol);

  // No decay period: warm-up runs up to total_epochs, then the floor.
  c.warmup_epochs = c.total_epochs;
  EXPECT_NEAR(lr_at(c, 84), 84.0 / 85.0, kTol);
  EXPECT_NEAR(lr_at(c, 85), 0.1, kTol);
}

TEST(Schedule, PolyDecays) {
  ScheduleConfig c = config(ScheduleKind::poly);  // power 2
  c.base_lr = 1;
  c.total_epochs = 100;
  EXPECT_EQ(lr_at(c, 0), 1);
  EXPECT_NEAR(lr_at(c, 25), 0.5625, kTol);
  EXPECT_NEAR(lr_at(c, 50), 0.25, kTol);
  EXPECT_NEAR(lr_at(c, 100), 0, kTol);
  EXPECT_NEAR(lr_at(c, 150), 0, kTol);
  c.final_lr = 0.2;
  c.power = 1;
  EXPECT_NEAR(lr_at(c, 50), 0.6, kTol);
  EXPECT_NEAR(lr_at(c, 100), 0.2, kTol);
}

TEST(Schedule, KindFromString) {
  EXPECT_EQ(schedule_kind_from_string("constant"), ScheduleKind::constant);
  EXPECT_EQ(schedule_kind_from_string("step"), ScheduleKind::step);
  EXPECT_EQ(schedule_kind_from_string("multistep"), ScheduleKind::multistep);
  EXPECT_EQ(schedule_kind_from_string("cosine"), ScheduleKind::cosine);
  EXPECT_EQ(schedule_kind_from_string("poly"), ScheduleKind::poly);
  for (auto k : {ScheduleKind::constant, ScheduleKind::step, ScheduleKind::multistep,
                 ScheduleKind::cosine, ScheduleKind::poly})
    EXPECT_EQ(schedule_kind_from_string(schedule_kind_name(k)), k);
  try {
    schedule_kind_from_string("cosin");
    ADD_FAILURE() << "unknown kind accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'cosin'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("constant, step, multistep, cosine, poly"), std::string::npos) << msg;
  }
}

TEST(Schedule, RejectsInvalidConfigNamingTheField) {
  ScheduleConfig c;
  c.base_lr = -0.1;
  expect_error(c, "base_lr");
  c = {};
  c.warmup_epochs = -1;
  expect_error(c, "warmup_epochs");
  c = {};
  c.warmup_start_factor = -0.5;
  expect_error(c, "warmup_start_factor");
  c = {};
  c.warmup_epochs = 100;
  expect_error(c, "warmup_epochs (100) exceeds total_epochs (90)");
  c = {};
  c.total_epochs = 0;
  expect_error(c, "total_epochs");
  c = config(ScheduleKind::step);
  c.step_size = 0;
  expect_error(c, "step_size");
  c = config(ScheduleKind::step);
  c.gamma = -0.1;
  expect_error(c, "gamma");
  c = config(ScheduleKind::multistep);
  c.milestones = {30, 30, 80};
  expect_error(c, "milestones must be strictly increasing");
  c.milestones = {60, 30};
  expect_error(c, "milestones");
  c.milestones = {-1, 30};
  expect_error(c, "milestones");
  c = config(ScheduleKind::poly);
  c.power = 0;
  expect_error(c, "power");
  c = config(ScheduleKind::cosine);
  c.final_lr = 0.5;
  expect_error(c, "final_lr");
  c.final_lr = -0.1;
  expect_error(c, "final_lr");
  c = {};
  c.base_lr = std::nan("");
  expect_error(c, "base_lr");
  expect_error(ScheduleConfig{}, "epoch", -1);
  EXPECT_NO_THROW(schedule_validate(ScheduleConfig{}));
}

}  // namespace
}  // namespace rt
