// RunMetrics: what a run reports and watches. Internal to the core.
//
// Contract
// - records: the run folder's metrics sinks (metrics.jsonl and those run.metrics names); closed
//   (writes nothing) where the process writes no run (rank > 0, evaluate-only use).
// - last_loss: the last training loss read (the summary's final_loss; saved in checkpoints).
// - last_finite_loss: the last finite one read and its step, which the summary adds where the
//   last loss is not finite (a skipped last step); after a resume, the checkpoint's if finite.
// - early_stopping (run.early_stopping_patience > 0) and keep_best (checkpoint.keep_best): the
//   watched metrics (train/metric_watch.h), saved in checkpoints ("watch"); absent when off.
// - best_path: the best checkpoint's file once one exists in this run's folder; empty before.
// - pending_underflow: the step's gradient-underflow record, measured before the step's outcome is
//   known and written once it is, tagged "skipped": true on a skipped step (its measurement ran
//   on the overflowed pass; `compare` leaves such records out).
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "runs/metrics_log.h"
#include "train/metric_watch.h"

namespace mixtrain::core {

struct RunMetrics {
  MetricsLog records;
  float last_loss = 0.0f;
  std::optional<std::pair<float, std::int64_t>> last_finite_loss;
  std::optional<MetricWatch> early_stopping, keep_best;
  std::filesystem::path best_path;
  std::optional<nlohmann::json> pending_underflow;

  void note_loss(float loss, std::int64_t step) {
    last_loss = loss;
    if (std::isfinite(loss)) last_finite_loss = {{loss, step}};
  }
};

}  // namespace mixtrain::core
