// What a training run ends with: its summary (returned by Trainer::run() and written as
// summary.json) and the verdict on whether it diverged.
//
// Contract
// - A run diverged when none of its steps was applied (every step skipped: non-finite gradients
//   at any loss scale) and it was not interrupted, when its final loss is not finite, or when
//   the trainer stopped it (run.on_nonfinite = "stop", or weights that are not finite).
//   `divergence` then says which, in one sentence; it is empty otherwise.
// - An interrupted run (Ctrl-C, SIGTERM) stopped after a completed step; its checkpoint for that
//   step was written and `evaluated` is false unless an evaluation ran at that step.
// - A run stopped early (run.early_stopping_patience) stopped after the evaluation that used up
//   its patience, before run.steps; its final checkpoint and evaluation are of that step.
// - summary.json always holds "diverged", "interrupted" and "stopped_early" (booleans);
//   "early_stopping" (the watched metric, its best and step, the evaluations since, and why it
//   stopped) when early stopping is on; "divergence" when it diverged; "eval_loss" /
//   "eval_accuracy" / "eval_step" only when an evaluation ran, and with them "eval_top<k>_accuracy"
//   when [eval] top_k = k; "best_checkpoint" (metric, value, step, and the file's path when it
//   is on disk) when checkpoint.keep_best is set and an evaluation gave a number; "segments"
//   (runs/component_history.h) when a resume changed a component of the run.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "mixtrain/core/graph/parameter_memory.h"
#include "mixtrain/core/runs/component_history.h"

namespace mixtrain::core {

struct EvalResult {
  double loss = 0.0;
  double accuracy = 0.0;
  std::int64_t rows = 0;
  std::int64_t top_k = 0;       // [eval] top_k; 0: top_k_accuracy was not computed
  double top_k_accuracy = 0.0;  // share of labels within the top_k logits (train/top_k.h)
};

// The metrics.jsonl / summary.json / `mixtrain eval` key of top-k accuracy: "eval_top5_accuracy".
std::string top_k_accuracy_key(std::int64_t k);
// Its inverse: k of "eval_top<k>_accuracy" (k a plain decimal), or 0 for any other key.
std::int64_t top_k_of_accuracy_key(std::string_view key);

// An evaluation number watched over a run (early stopping, the best checkpoint): its best value
// and when, as summary.json reports them.
struct WatchedSummary {
  std::string metric;     // "eval_loss", ...
  bool has_best = false;  // false: no evaluation gave a number yet
  double best = 0.0;
  std::int64_t best_step = 0;
  std::int64_t bad_evals = 0;  // evaluations since the best
};

struct TrainSummary {
  std::int64_t steps = 0;
  std::int64_t applied_steps = 0;
  std::int64_t skipped_steps = 0;
  double final_loss = 0.0;
  // Where final_loss is not finite (a skipped last step): the last finite loss read and its step.
  std::optional<double> last_finite_loss;
  std::int64_t last_finite_loss_step = 0;
  // The steps at the end of the run, in a row, whose loss was not finite (each one skipped).
  std::int64_t trailing_nonfinite_steps = 0;
  bool evaluated = false;  // `eval` holds an evaluation, made at `eval_step`
  std::int64_t eval_step = 0;
  EvalResult eval;
  double final_loss_scale = 1.0;
  std::size_t peak_memory_bytes = 0;
  std::size_t peak_rss_bytes = 0;                  // the training loop's peak
  std::size_t peak_rss_bytes_with_checkpoint = 0;  // including the final checkpoint's copies
  double samples_per_s = 0.0;
  double wall_seconds = 0.0;
  std::int64_t parameters = 0;
  // "parameter_memory" in summary.json, written when something is frozen (graph/parameter_memory.h)
  ParameterMemory parameter_memory;
  std::string policy, scaler, optimizer, backend;
  // "precision" in summary.json: the policy that applied (`auto` resolved) and, per GEMM input
  // dtype the plan uses, whether the backend runs it natively and how.
  std::string resolved_policy;
  struct GemmInput {
    bool native = false;
    std::string how;
  };
  std::map<std::string, GemmInput> gemm_inputs;
  std::filesystem::path resumed_from;  // empty: a fresh run
  // The components by range of steps, across the resumes that led here ("segments" in
  // summary.json when there is more than one: a resume switched the policy, say).
  ComponentHistory segments;
  // The resumed checkpoint was already at run.steps: nothing was trained and nothing written.
  bool already_complete = false;
  std::filesystem::path run_dir;
  bool diverged = false;
  std::string divergence;  // why it diverged, one sentence; empty when it did not
  // The remedy where the usual one (the learning rate, the scaler, a wider policy) is not it:
  // weights that are not finite. Empty otherwise; not in summary.json.
  std::string divergence_remedy;
  bool interrupted = false;
  // run.early_stopping_patience > 0: the watched metric, and why the run stopped when it did.
  bool early_stopping = false;
  std::int64_t early_stopping_patience = 0;
  double early_stopping_min_delta = 0.0;
  WatchedSummary early_stopping_watch;
  bool stopped_early = false;
  std::string early_stopping_reason;  // one sentence when stopped_early
  // checkpoint.keep_best: the best evaluation and its checkpoint (empty when none is on disk).
  bool keep_best = false;
  WatchedSummary best;
  std::filesystem::path best_checkpoint;
  // [distributed]: "distributed" in summary.json. Bytes are per rank, the largest rank's, as the
  // backend counted them (optimizer state: the slots the optimizer holds on the rank).
  struct Distributed {
    int world_size = 0;        // 0: one process (no "distributed" entry)
    std::string communicator;  // its description()
    bool shard_optimizer = false;
    std::int64_t buckets = 0;
    std::size_t optimizer_state_bytes = 0;
    std::size_t peak_memory_bytes = 0;
    double wait_seconds = 0.0;    // blocked in finish_gradients, over the run (rank 0's)
    double gather_seconds = 0.0;  // sharded: the masters' all-gathers
    std::int64_t buckets_started_in_backward = 0, buckets_communicated = 0;
    // At the end, every rank held the same masters, optimizer scalars, scaler and policy state
    // (and, unsharded, optimizer slots).
    bool ranks_identical = false;
  };
  Distributed distributed;
};

// The reason a run with these totals diverged ("every one of the 300 steps was skipped ...", or a
// non-finite loss on each of its last kDivergedTail steps), or empty. One or two non-finite last
// steps after finite ones are an overflow the skip absorbed (a dynamic scaler's business), not a
// divergence. `stopped_by` is the message of an on_nonfinite = "stop" stop, if any.
inline constexpr std::int64_t kDivergedTail = 3;
std::string divergence_reason(const TrainSummary& summary, const std::string& stopped_by);

void write_run_summary(const std::filesystem::path& file, const TrainSummary& summary);

}  // namespace mixtrain::core
