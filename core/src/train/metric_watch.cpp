#include "train/metric_watch.h"

#include <cmath>
#include <stdexcept>
#include <utility>

namespace mixtrain::core {

bool metric_minimized(const std::string& metric) {
  return metric == "eval_loss";
}

double eval_metric_value(const EvalResult& r, const std::string& metric) {
  if (metric == "eval_loss") return r.loss;
  if (metric == "eval_accuracy") return r.accuracy;
  if (r.top_k > 0 && metric == top_k_accuracy_key(r.top_k)) return r.top_k_accuracy;
  throw std::logic_error("eval_metric_value: the evaluation has no '" + metric + "'");
}

MetricWatch::MetricWatch(std::string metric, double delta)
    : minimize(metric_minimized(metric)), min_delta(delta) {
  state.metric = std::move(metric);
}

bool MetricWatch::observe(double value, std::int64_t step) {
  if (step <= state.last_eval_step) return false;  // evaluations happen after step 1 or later
  state.last_eval_step = step;
  const bool improved =
      !std::isnan(value) && (!state.has_best || (minimize ? value < state.best - min_delta
                                                          : value > state.best + min_delta));
  if (!improved) {
    ++state.bad_evals;
    return false;
  }
  state.has_best = true;
  state.best = value;
  state.best_step = step;
  state.bad_evals = 0;
  return true;
}

}  // namespace mixtrain::core
