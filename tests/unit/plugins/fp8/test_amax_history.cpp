// AmaxHistory: the ring of per-step amaxes — roll, the two maxes (NaN wins / NaN skipped), and
// the resize rule used when a checkpoint was written with another amax_history_len.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "amax_history.h"

namespace mixtrain::fp8 {
namespace {

TEST(fp8_amax_history, StartsAtZeroAndKeepsItsLength) {
  AmaxHistory h(4);
  EXPECT_EQ(h.length(), 4u);
  EXPECT_EQ(h.position(), 0u);
  EXPECT_EQ(h.max(), 0.0f);
  for (int i = 0; i < 10; ++i) {
    h.record(static_cast<float>(i + 1));
    h.roll();
    EXPECT_EQ(h.length(), 4u);
  }
}

TEST(fp8_amax_history, RecordTakesTheMaxWithinAStep) {
  AmaxHistory h(3);
  h.record(3.0f);
  h.record(5.0f);
  h.record(4.0f);
  EXPECT_EQ(h.current(), 5.0f) << "input cast in forward and again in backward";
}

TEST(fp8_amax_history, RollDropsTheOldestAndZeroesTheNewStep) {
  AmaxHistory h(3);  // the step in progress plus two completed steps
  for (float a : {1.0f, 2.0f, 3.0f, 4.0f}) {
    h.record(a);
    h.roll();
  }
  EXPECT_EQ(h.current(), 0.0f);
  EXPECT_EQ(h.chronological(), (std::vector<float>{3.0f, 4.0f, 0.0f}));
  EXPECT_EQ(h.max(), 4.0f);
  EXPECT_EQ(h.position(), 1u) << "four rolls around a ring of three";
}

TEST(fp8_amax_history, NanPoisonsTheMaxUntilItAgesOut) {
  AmaxHistory h(2);
  h.record(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(h.max()));
  h.roll();
  h.record(1.0f);
  EXPECT_TRUE(std::isnan(h.max()));
  h.roll();
  h.record(1.0f);
  EXPECT_EQ(h.max(), 1.0f);
}

TEST(fp8_amax_history, MaxIgnoringNanSkipsNanButNotInf) {
  AmaxHistory h(3);
  h.record(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(h.max_ignoring_nan(), 0.0f) << "fmaxf from 0 over {0, 0, NaN}";
  h.roll();
  h.record(2.0f);
  EXPECT_EQ(h.max_ignoring_nan(), 2.0f);
  EXPECT_TRUE(std::isnan(h.max()));
  h.roll();
  h.record(std::numeric_limits<float>::infinity());
  EXPECT_EQ(h.max_ignoring_nan(), std::numeric_limits<float>::infinity());
}

TEST(fp8_amax_history, DiscardZeroesOnlyTheStepInProgress) {
  AmaxHistory h(3);
  h.record(2.0f);
  h.roll();
  h.record(9.0f);
  h.discard_current();
  EXPECT_EQ(h.chronological(), (std::vector<float>{0.0f, 2.0f, 0.0f}));
}

TEST(fp8_amax_history, ResizeKeepsTheMostRecentEntriesInOrder) {
  AmaxHistory h(4);
  for (float a : {1.0f, 2.0f, 3.0f}) {
    h.record(a);
    h.roll();
  }
  h.record(7.0f);  // step in progress
  ASSERT_EQ(h.chronological(), (std::vector<float>{1.0f, 2.0f, 3.0f, 7.0f}));

  const auto shorter = h.resized(2);
  EXPECT_EQ(shorter.chronological(), (std::vector<float>{3.0f, 7.0f}));
  EXPECT_EQ(shorter.current(), 7.0f);

  const auto longer = h.resized(6);
  EXPECT_EQ(longer.chronological(), (std::vector<float>{0.0f, 0.0f, 1.0f, 2.0f, 3.0f, 7.0f}));
  EXPECT_EQ(longer.current(), 7.0f);
}

TEST(fp8_amax_history, RejectsBadRings) {
  EXPECT_THROW(AmaxHistory(0), std::invalid_argument);
  EXPECT_THROW(AmaxHistory(std::vector<float>{}, 0), std::invalid_argument);
  EXPECT_THROW(AmaxHistory(std::vector<float>{0.0f, 0.0f}, 2), std::invalid_argument);
}

}  // namespace
}  // namespace mixtrain::fp8
