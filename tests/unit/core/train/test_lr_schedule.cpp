// Each schedule's formula on hand-computed values, warm-up's composition with it, and the
// properties a run relies on (monotone decays, clamping past the end). PyTorch parity of the
// same schedules: tests/integration/test_lr_schedule_parity.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "mixtrain/core/train/lr_schedule.h"

namespace mixtrain::core {
namespace {

LrSchedule schedule(const std::string& kind, double base, std::int64_t warmup, std::int64_t total) {
  LrSchedule s;
  s.kind = *find_choice(kind, kLrScheduleKinds);
  s.base_lr = base;
  s.warmup_steps = warmup;
  s.total_steps = total;
  return s;
}

TEST(LrSchedule, ConstantIgnoresProgress) {
  LrSchedule s{LrScheduleKind::constant, 0.1, 0.0, 10, 100};
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(99), 0.1);
}

TEST(LrSchedule, WarmupIsLinearFromOneStep) {
  LrSchedule s{LrScheduleKind::warmup_cosine, 1.0, 0.0, 4, 104};
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 1.0);
}

TEST(LrSchedule, CosineDecaysToMinLr) {
  LrSchedule s{LrScheduleKind::warmup_cosine, 1.0, 0.1, 0, 100};
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1.0);
  EXPECT_NEAR(s.lr_at(50), 0.55, 1e-12);  // halfway: min + (base-min)/2
  EXPECT_NEAR(s.lr_at(100), 0.1, 1e-12);
  EXPECT_NEAR(s.lr_at(1000), 0.1, 1e-12);  // clamps past the end
  for (int i = 1; i <= 100; ++i) EXPECT_LE(s.lr_at(i), s.lr_at(i - 1));
}

TEST(LrSchedule, LinearDecaysToMinLrOverTheStepsAfterWarmup) {
  auto s = schedule("linear", 1.0, 10, 110);
  s.min_lr = 0.2;
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);                    // warm-up: (k + 1) / W
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1.0);                    // its last step reaches the peak
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1.0);                   // the decay's clock starts at 0
  EXPECT_NEAR(s.lr_at(60), 0.6, 1e-15);                 // half of the 100 decay steps
  EXPECT_NEAR(s.lr_at(109), 0.2 + 0.8 / 100.0, 1e-15);  // the last step is one short of min_lr
  EXPECT_DOUBLE_EQ(s.lr_at(110), 0.2);
  EXPECT_DOUBLE_EQ(s.lr_at(500), 0.2);  // clamps past the end
  // No min_lr: transformers' get_linear_schedule_with_warmup, (total - k) / (total - W).
  auto z = schedule("linear", 3e-4, 4, 20);
  for (int k = 4; k < 20; ++k) EXPECT_NEAR(z.lr_at(k), 3e-4 * (20.0 - k) / 16.0, 1e-18) << k;
}

TEST(LrSchedule, StepMultipliesByGammaEveryStepSizeAfterWarmup) {
  auto s = schedule("step", 0.1, 0, 100);
  s.step_size = 3;
  s.gamma = 0.5;
  const double expected[] = {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025};
  for (int k = 0; k < 7; ++k) EXPECT_DOUBLE_EQ(s.lr_at(k), expected[k]) << k;
  s.warmup_steps = 2;  // shifts the decays by the warm-up
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.05);
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.05);
}

TEST(LrSchedule, MultistepDecaysAtEachMilestoneCountedAfterWarmup) {
  auto s = schedule("multistep", 1.0, 0, 100);
  s.milestones = {2, 5};
  s.gamma = 0.1;
  const double expected[] = {1.0, 1.0, 0.1, 0.1, 0.1, 0.01, 0.01};
  for (int k = 0; k < 7; ++k) EXPECT_NEAR(s.lr_at(k), expected[k], 1e-16) << k;
  s.warmup_steps = 3;
  EXPECT_NEAR(s.lr_at(0), 1.0 / 3.0, 1e-16);
  EXPECT_DOUBLE_EQ(s.lr_at(4), 1.0);
  EXPECT_NEAR(s.lr_at(5), 0.1, 1e-16);  // milestone 2 of the schedule's own clock
  EXPECT_NEAR(s.lr_at(8), 0.01, 1e-17);
  EXPECT_NEAR(s.lr_at(1000), 0.01, 1e-17);
}

TEST(LrSchedule, OneCycleRisesFromLrOverDivFactorAndEndsAtItsFloor) {
  // torch's OneCycleLR(max_lr=0.1, total_steps=10, pct_start=0.3): phase one ends at step 2.
  auto s = schedule("onecycle", 0.1, 0, 10);
  EXPECT_NEAR(s.lr_at(0), 0.1 / 25.0, 1e-17);
  EXPECT_NEAR(s.lr_at(1), 0.004 + (0.1 - 0.004) / 2.0, 1e-16);  // pct 1/2 of the rise
  EXPECT_DOUBLE_EQ(s.lr_at(2), 0.1);
  const double floor = 0.1 / 25.0 / 1e4;
  EXPECT_NEAR(s.lr_at(9), floor, 1e-20);
  const double pct = (5.0 - 2.0) / (9.0 - 2.0);
  EXPECT_NEAR(s.lr_at(5), floor + (0.1 - floor) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0),
              1e-16);
  EXPECT_NEAR(s.lr_at(50), floor, 1e-20);  // stays at the floor past the end
  for (int k = 3; k < 10; ++k) EXPECT_LT(s.lr_at(k), s.lr_at(k - 1)) << k;
  s.div_factor = 10.0;
  s.final_div_factor = 100.0;
  EXPECT_NEAR(s.lr_at(0), 0.01, 1e-17);
  EXPECT_NEAR(s.lr_at(9), 1e-4, 1e-19);
}

TEST(LrSchedule, InverseSqrtWarmsUpThenDecaysAsTheRootOfTheStep) {
  auto s = schedule("inverse_sqrt", 1e-3, 4, 1000);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.25e-3);        // n = k + 1 = 1: n / W
  EXPECT_DOUBLE_EQ(s.lr_at(3), 1e-3);           // n = W: the peak, once
  EXPECT_NEAR(s.lr_at(15), 1e-3 * 0.5, 1e-18);  // n = 16: sqrt(4 / 16)
  EXPECT_NEAR(s.lr_at(99), 1e-3 * std::sqrt(4.0 / 100.0), 1e-18);
  for (int k = 4; k < 200; ++k) EXPECT_LT(s.lr_at(k), s.lr_at(k - 1)) << k;
}

TEST(LrSchedule, EveryKindIsListed) {
  for (const auto& kind : lr_schedule_kinds()) {
    auto s = schedule(kind, 0.5, kind == "onecycle" ? 0 : 2, 20);
    s.milestones = {5};
    for (int k = 0; k < 20; ++k) {
      const double lr = s.lr_at(k);
      EXPECT_TRUE(std::isfinite(lr) && lr > 0.0 && lr <= 0.5) << kind << " " << k << " " << lr;
    }
  }
}

}  // namespace
}  // namespace mixtrain::core
