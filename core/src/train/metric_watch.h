// An eval metric watched across a run's evaluations for improvement: the best checkpoint
// (checkpoint.keep_best) and early stopping (run.early_stopping_patience). Internal to the core.
//
// Contract
// - The metric is one of an evaluation's numbers: "eval_loss" (minimised), "eval_accuracy" or
//   "eval_top<k>_accuracy" (maximised); the config reader checks the name.
// - observe(value, step) counts one evaluation. It improves when there is no best yet and the
//   value is not NaN, or when it beats the best by more than min_delta (value < best - min_delta
//   minimised, value > best + min_delta maximised: Keras' and Lightning's EarlyStopping rule;
//   min_delta = 0 means strictly better, so a tie keeps the earlier best). An improvement sets
//   best and best_step and zeroes bad_evals; anything else, NaN included, counts one bad
//   evaluation. An evaluation at a step already counted (a resumed finished run evaluates its
//   last step again) changes nothing and is no improvement.
// - The state is what a checkpoint saves (checkpoint/state.h "watch"), so a resumed run goes on
//   from the same best and the same count.
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/state.h"
#include "mixtrain/core/runs/summary.h"

namespace mixtrain::core {

bool metric_minimized(const std::string& metric);
// The value of `metric` in an evaluation.
double eval_metric_value(const EvalResult& r, const std::string& metric);

struct MetricWatch {
  MetricWatch(std::string metric, double min_delta);
  // Whether the evaluation at `step` improved on the best (see the contract).
  bool observe(double value, std::int64_t step);

  WatchedMetric state;
  bool minimize = true;
  double min_delta = 0.0;
};

}  // namespace mixtrain::core
