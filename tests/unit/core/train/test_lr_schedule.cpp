#include <gtest/gtest.h>

#include "mixtrain/core/train/lr_schedule.h"

namespace mixtrain::core {
namespace {

TEST(LrSchedule, ConstantIgnoresProgress) {
  LrSchedule s{"constant", 0.1, 0.0, 10, 100};
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(99), 0.1);
}

TEST(LrSchedule, WarmupIsLinearFromOneStep) {
  LrSchedule s{"warmup_cosine", 1.0, 0.0, 4, 104};
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 1.0);
}

TEST(LrSchedule, CosineDecaysToMinLr) {
  LrSchedule s{"warmup_cosine", 1.0, 0.1, 0, 100};
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1.0);
  EXPECT_NEAR(s.lr_at(50), 0.55, 1e-12);  // halfway: min + (base-min)/2
  EXPECT_NEAR(s.lr_at(100), 0.1, 1e-12);
  EXPECT_NEAR(s.lr_at(1000), 0.1, 1e-12);  // clamps past the end
  for (int i = 1; i <= 100; ++i) EXPECT_LE(s.lr_at(i), s.lr_at(i - 1));
}

}  // namespace
}  // namespace mixtrain::core
