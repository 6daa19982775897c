// The training-state entries of a checkpoint's metadata — "progress", "sampler",
// "mixtrain.state_version", the components' states and the watched eval metrics ("watch":
// checkpoint.keep_best and early stopping) — as the trainer writes and reads them.
//
// Contract: writers produce JSON that the readers accept back unchanged. Readers trust nothing:
// a checkpoint can be CRC-valid and still hold any JSON. Every integer must be a JSON integer
// that fits in int64 (never a float, never an unsigned value past INT64_MAX that would wrap),
// every counter lies in its range, and each failure is sdk::CheckpointError naming the file and
// the field ("progress.step", "optimizer state entry 'step'") with the valid range. Non-finite
// doubles are written as null (JSON has no NaN) and read back as NaN.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "mixtrain/core/data/batch_sampler.h"
#include "mixtrain/sdk/component_state.h"

namespace mixtrain::core {

// The value of "mixtrain.state_version" this build writes, and the only one it reads.
inline constexpr const char* kTrainingStateVersion = "1";

nlohmann::json component_state_to_json(const std::string& component,
                                       const sdk::ComponentState& state);

// `what` is the role ("optimizer", "scaler", "policy"); the state must have been written by
// `expected_component`.
sdk::ComponentState component_state_from_json(const nlohmann::json& j, const std::string& what,
                                              const std::string& expected_component,
                                              const std::filesystem::path& file);

// Rejects a checkpoint whose "mixtrain.state_version" is absent or not exactly
// kTrainingStateVersion, or that a format marked "mixtrain.weights_only" (checkpoint_format.h).
void check_training_state_version(const std::map<std::string, std::string>& metadata,
                                  const std::filesystem::path& file);

struct TrainingProgress {
  std::int64_t step = 0;     // steps taken, applied or skipped
  std::int64_t applied = 0;  // steps whose update reached the optimizer
  std::int64_t skipped = 0;  // applied + skipped == step
  float last_loss = 0.0f;    // may be NaN (a diverged last step)
};

nlohmann::json progress_to_json(const TrainingProgress& p);

// `run_steps`: the run's run.steps. A checkpoint beyond it belongs to a longer run: resuming it
// would train nothing and rewrite a checkpoint past the run's end, so it is refused with the
// hint to raise run.steps. A checkpoint at exactly run.steps is a finished run (it is evaluated
// and saved again, as before).
TrainingProgress read_progress(const nlohmann::json& j, std::int64_t run_steps,
                               const std::filesystem::path& file);

// The sampler cursor, checked against the run: each field in range (position within an epoch of
// `batches_per_epoch`, epoch <= step), then the cursor itself, which follows from the step since
// every step draws run.accumulate batches: `step` is the batches drawn, progress.step x
// run.accumulate (a changed data.batch_size or run.accumulate shows here).
BatchSampler::Cursor read_sampler_cursor(const nlohmann::json& j, std::int64_t step,
                                         std::int64_t batches_per_epoch,
                                         const std::filesystem::path& file);

// The counter entries whose meaning component_state.h fixes ("steps" of a scaler, "step" of an
// optimizer, ...) must equal the run's own counts; `what` is "scaler", "optimizer" or "policy".
void check_component_counters(const sdk::ComponentState& state, const std::string& what,
                              const TrainingProgress& progress, const std::filesystem::path& file);

// An eval metric watched across evaluations (train/metric_watch.h): the best value seen, when,
// and how many evaluations have passed since it improved. Written under the metadata entry
// "watch" as {"keep_best": {...}, "early_stopping": {...}}, each present when the run watches
// it. "watch" is optional: checkpoints from before it (and runs that watch nothing) have none,
// and a resume then starts watching afresh; the state version stays "1".
struct WatchedMetric {
  std::string metric;               // "eval_loss", "eval_accuracy", "eval_top5_accuracy"
  bool has_best = false;            // no evaluation yet: best and best_step are meaningless
  double best = 0.0;                // may be NaN only when has_best is false
  std::int64_t best_step = 0;       // the step of the evaluation that set best
  std::int64_t bad_evals = 0;       // evaluations since best improved
  std::int64_t last_eval_step = 0;  // the last evaluation counted (an evaluation at a step
                                    // already counted, as a resumed finished run repeats, is not)
};

nlohmann::json watched_metric_to_json(const WatchedMetric& w);

// `field` names the entry in messages ("watch.early_stopping"); `step` is progress.step: every
// step the state names lies in [0, step] and bad_evals in [0, step].
WatchedMetric read_watched_metric(const nlohmann::json& j, const std::string& field,
                                  std::int64_t step, const std::filesystem::path& file);

// A JSON integer in [min, max] ("field" names it in the message).
std::int64_t read_checkpoint_int(const nlohmann::json& j, const std::string& field,
                                 std::int64_t min, std::int64_t max,
                                 const std::filesystem::path& file);

}  // namespace mixtrain::core
