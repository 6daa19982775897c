// The watched eval metric behind early stopping and the best checkpoint: which way is better,
// min_delta, NaN, and an evaluation counted twice.
#include <gtest/gtest.h>

#include <cmath>

#include "train/metric_watch.h"

namespace mixtrain::core {
namespace {

TEST(MetricWatch, LossImprovesDownwardsByMoreThanMinDelta) {
  MetricWatch w("eval_loss", 0.1);
  EXPECT_TRUE(w.minimize);
  EXPECT_TRUE(w.observe(2.0, 10));    // the first number is the best so far
  EXPECT_FALSE(w.observe(1.95, 20));  // better, but not by more than 0.1
  EXPECT_EQ(w.state.bad_evals, 1);
  EXPECT_FALSE(w.observe(1.9, 30));  // exactly min_delta is not more than it
  EXPECT_EQ(w.state.bad_evals, 2);
  EXPECT_TRUE(w.observe(1.85, 40));
  EXPECT_EQ(w.state.bad_evals, 0);
  EXPECT_EQ(w.state.best, 1.85);
  EXPECT_EQ(w.state.best_step, 40);
}

TEST(MetricWatch, AccuracyImprovesUpwardsAndATieKeepsTheEarlierBest) {
  MetricWatch w("eval_top5_accuracy", 0.0);
  EXPECT_FALSE(w.minimize);
  EXPECT_TRUE(w.observe(0.5, 5));
  EXPECT_FALSE(w.observe(0.5, 10));
  EXPECT_FALSE(w.observe(0.4, 15));
  EXPECT_EQ(w.state.best_step, 5);
  EXPECT_EQ(w.state.bad_evals, 2);
  EXPECT_TRUE(w.observe(0.6, 20));
  EXPECT_EQ(w.state.best_step, 20);
}

TEST(MetricWatch, NanIsNeverAnImprovementAndAStepIsCountedOnce) {
  MetricWatch w("eval_loss", 0.0);
  EXPECT_FALSE(w.observe(std::nan(""), 5));
  EXPECT_FALSE(w.state.has_best);
  EXPECT_EQ(w.state.bad_evals, 1);
  EXPECT_TRUE(w.observe(3.0, 10));
  EXPECT_FALSE(w.observe(std::nan(""), 15));
  EXPECT_EQ(w.state.bad_evals, 1);
  // A resumed finished run evaluates its last step again: not a second evaluation.
  EXPECT_FALSE(w.observe(1.0, 15));
  EXPECT_EQ(w.state.bad_evals, 1);
  EXPECT_EQ(w.state.best, 3.0);
}

TEST(MetricWatch, ValuesComeFromTheEvaluation) {
  EvalResult r;
  r.loss = 0.25;
  r.accuracy = 0.75;
  r.top_k = 3;
  r.top_k_accuracy = 0.9;
  EXPECT_EQ(eval_metric_value(r, "eval_loss"), 0.25);
  EXPECT_EQ(eval_metric_value(r, "eval_accuracy"), 0.75);
  EXPECT_EQ(eval_metric_value(r, "eval_top3_accuracy"), 0.9);
  EXPECT_THROW(eval_metric_value(r, "eval_top5_accuracy"), std::logic_error);
}

}  // namespace
}  // namespace mixtrain::core
