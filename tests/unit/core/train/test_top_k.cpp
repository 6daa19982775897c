// Top-k hits on hand-made logits: ranks, ties (a stable sort by descending logit), NaN, and k = 1
// as the loss's argmax counts it.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "train/top_k.h"

namespace mixtrain::core {
namespace {

std::int64_t hits(const std::vector<float>& logits, const std::vector<std::int32_t>& labels,
                  std::int64_t classes, std::int64_t k) {
  return top_k_hits(logits, labels, classes, k);
}

TEST(TopK, ALabelIsAHitWhenFewerThanKClassesRankAboveIt) {
  // Row 0: ranks 2, 0, 3, 1 for classes 0..3; row 1: 1, 3, 0, 2.
  const std::vector<float> z = {0.5f, 3.0f, -1.0f, 2.0f, /**/ 2.0f, -4.0f, 7.0f, 1.0f};
  for (std::int32_t y = 0; y < 4; ++y) {
    const std::int64_t rank0[] = {2, 0, 3, 1};
    for (std::int64_t k = 1; k <= 4; ++k)
      EXPECT_EQ(hits({z.begin(), z.begin() + 4}, {y}, 4, k), rank0[y] < k ? 1 : 0)
          << "y " << y << " k " << k;
  }
  EXPECT_EQ(hits(z, {0, 0}, 4, 2), 1);  // rank 2 misses, rank 1 hits
  EXPECT_EQ(hits(z, {2, 3}, 4, 3), 1);
  EXPECT_EQ(hits(z, {2, 3}, 4, 4), 2);  // k = classes: every label
}

TEST(TopK, TiesRankTheLowerIndexFirstAsArgmaxDoes) {
  // Classes 1, 2 and 3 tie for the top.
  const std::vector<float> z = {0.0f, 5.0f, 5.0f, 5.0f, 1.0f};
  EXPECT_EQ(hits(z, {1}, 5, 1), 1);  // the argmax: the first of the tied
  EXPECT_EQ(hits(z, {2}, 5, 1), 0);
  EXPECT_EQ(hits(z, {2}, 5, 2), 1);
  EXPECT_EQ(hits(z, {3}, 5, 2), 0);
  EXPECT_EQ(hits(z, {3}, 5, 3), 1);
  EXPECT_EQ(hits(z, {4}, 5, 3), 0);  // three tied ahead of it
  EXPECT_EQ(hits(z, {4}, 5, 4), 1);
  // -0 and +0 are equal logits.
  EXPECT_EQ(hits({0.0f, -0.0f}, {1}, 2, 1), 0);
  EXPECT_EQ(hits({-0.0f, 0.0f}, {0}, 2, 1), 1);
}

// NaNs rank as the loss's argmax ranks them (a scan from class 0 that moves on a strictly greater
// logit), so top-1 is eval_accuracy on such rows too: a NaN at class 0 wins, one elsewhere never.
TEST(TopK, ANanAtClassZeroRanksFirstAndANanElsewhereLastAndMisses) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(hits({nan, 1.0f, 2.0f}, {0}, 3, 1), 1);
  EXPECT_EQ(hits({nan, 1.0f, 2.0f}, {2}, 3, 1), 0);
  EXPECT_EQ(hits({nan, 1.0f, 2.0f}, {2}, 3, 2), 1);
  EXPECT_EQ(hits({nan, 1.0f, 2.0f}, {1}, 3, 2), 0);
  EXPECT_EQ(hits({1.0f, nan, 2.0f}, {0}, 3, 2), 1);
  EXPECT_EQ(hits({1.0f, nan, 2.0f}, {1}, 3, 3), 0);
}

TEST(TopK, KOneCountsTheLabelsThatAreTheFirstArgmax) {
  // Positions of a language model are rows: 3 positions of 3 classes.
  const std::vector<float> z = {1, 1, 0, /**/ 0, 2, 2, /**/ -1, -2, -3};
  const std::vector<std::int32_t> y = {1, 1, 0};
  EXPECT_EQ(hits(z, y, 3, 1), 2);  // position 0's argmax is class 0, not 1
  EXPECT_EQ(hits(z, y, 3, 2), 3);
}

}  // namespace
}  // namespace mixtrain::core
