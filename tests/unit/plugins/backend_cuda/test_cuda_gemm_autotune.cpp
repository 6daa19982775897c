// GEMM autotuning's choice among cuBLASLt's heuristic candidates (cuda_gemm_autotune.h): the
// fastest median wins, ties and near-ties go to the earlier heuristic index, failed candidates are
// skipped. Pure host code: runs without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda_gemm_autotune.h"

namespace mixtrain::backend_cuda {
namespace {

using Times = std::vector<std::vector<float>>;

int pick(const Times& t, float tolerance = 0.0f) {
  return pick_autotuned_candidate(t, tolerance);
}

TEST(cuda_gemm_autotune, TheScoreIsTheMedianOfTheRounds) {
  const std::vector<float> odd{3.0f, 1.0f, 2.0f};
  const std::vector<float> even{4.0f, 1.0f, 3.0f, 2.0f};
  const std::vector<float> one{0.25f};
  EXPECT_FLOAT_EQ(autotune_score(odd), 2.0f);
  EXPECT_FLOAT_EQ(autotune_score(even), 2.5f);
  EXPECT_FLOAT_EQ(autotune_score(one), 0.25f);
}

TEST(cuda_gemm_autotune, AFailedOrEmptyMeasurementHasNoScore) {
  const std::vector<float> none;
  const std::vector<float> negative{1.0f, -1.0f, 1.0f};
  const std::vector<float> nan{1.0f, std::numeric_limits<float>::quiet_NaN()};
  const std::vector<float> inf{std::numeric_limits<float>::infinity()};
  EXPECT_LT(autotune_score(none), 0.0f);
  EXPECT_LT(autotune_score(negative), 0.0f);
  EXPECT_LT(autotune_score(nan), 0.0f);
  EXPECT_LT(autotune_score(inf), 0.0f);
}

TEST(cuda_gemm_autotune, TheFastestMedianWins) {
  EXPECT_EQ(pick({{1.00f, 1.01f, 1.02f}, {0.97f, 0.98f, 0.99f}, {0.99f, 1.00f, 1.00f}}), 1);
  // One fast outlier round does not decide: candidate 0's median is lower.
  EXPECT_EQ(pick({{1.00f, 1.00f, 1.00f}, {0.50f, 1.10f, 1.10f}}), 0);
  // The last candidate can win.
  EXPECT_EQ(pick({{2.0f}, {1.5f}, {1.2f}, {1.0f}}), 3);
}

TEST(cuda_gemm_autotune, TiesGoToTheEarlierHeuristicIndex) {
  EXPECT_EQ(pick({{1.0f, 1.0f}, {1.0f, 1.0f}}), 0);
  EXPECT_EQ(pick({{2.0f}, {1.0f}, {1.0f}, {1.0f}}), 1);
}

TEST(cuda_gemm_autotune, FailedCandidatesAreSkipped) {
  // Candidate 0 was declined (no time); 1 failed a round; 2 is the only one fully timed.
  EXPECT_EQ(pick({{}, {0.5f, -1.0f, 0.5f}, {0.9f, 0.9f, 0.9f}}), 2);
  EXPECT_EQ(pick({{}, {std::numeric_limits<float>::quiet_NaN()}}), -1);
  EXPECT_EQ(pick({}), -1);
}

TEST(cuda_gemm_autotune, ANearTieWithinTheToleranceKeepsTheEarlierCandidate) {
  // 0.3 % faster: noise at 0.5 % tolerance, a win without it.
  const Times near{{1.000f}, {0.997f}};
  EXPECT_EQ(pick(near, 0.005f), 0);
  EXPECT_EQ(pick(near, 0.0f), 1);
  // 2 % faster wins with the tolerance too.
  EXPECT_EQ(pick({{1.00f}, {0.98f}}, 0.005f), 1);
  // The tolerance is relative to the current choice: 1 does not beat 0, 2 beats 0 by 0.8 %.
  EXPECT_EQ(pick({{1.000f}, {0.996f}, {0.992f}}, 0.005f), 2);
  // A nonsensical tolerance is treated as 0.
  EXPECT_EQ(pick(near, -1.0f), 1);
  EXPECT_EQ(pick(near, std::numeric_limits<float>::quiet_NaN()), 1);
}

// The report line both autotuners (GEMM and convolution) write after tuning.
TEST(cuda_gemm_autotune, TheSummaryNamesTheChoiceAndTheFirstCandidateItBeat) {
  const Times t{{0.12f, 0.13f, 0.11f}, {0.09f, 0.08f, 0.10f}, {}};
  EXPECT_EQ(autotune_summary(t, 1, 3),
            "autotuned over 3 candidates x 3 rounds: #1 0.0900 ms, #0 0.1200 ms");
  EXPECT_EQ(autotune_summary(t, 0, 3), "autotuned over 3 candidates x 3 rounds: #0 0.1200 ms");
  // A first candidate without a score is not quoted.
  const Times dropped{{}, {0.5f}};
  EXPECT_EQ(autotune_summary(dropped, 1, 1),
            "autotuned over 2 candidates x 1 rounds: #1 0.5000 ms");
}

}  // namespace
}  // namespace mixtrain::backend_cuda
