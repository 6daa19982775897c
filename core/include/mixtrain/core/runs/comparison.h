// Run comparison: the parity check of several training runs against a baseline (the first run).
//
// Contract
// - load_run() reads one run folder written by `mixtrain train`: metrics.jsonl (required) and
//   summary.json (optional: an interrupted run has none, and its values are then derived from
//   metrics.jsonl; peak memory is then unknown; a summary without an evaluation, that of a resumed
//   session stopped before its first, takes the last one metrics.jsonl holds). Policy and scaler
//   come from summary.json, else
//   from config.toml; the policy `auto` resolved to, and whether each GEMM input dtype ran
//   natively, come from summary.json's "precision" record only. The [model] and [data] sections
//   of config.toml (sub-tables and arrays included) and run.seed (it draws the synthetic data and
//   the held-out split) are kept flattened for the setup check.
//   Bad input raises sdk::UserError (folder missing) or sdk::DataError (metrics.jsonl missing, a
//   malformed record — the message names file:line).
// - compare_runs() computes one row per run; values that cannot be known are std::nullopt.
//   The loss gap is measured on smoothed training losses over the steps both the run and the
//   baseline logged (smoothed_common_losses(): a trailing mean over W = kLossSmoothingIntervals
//   times their usual common logging interval, from the first full window on), so runs logged
//   at different intervals average the same batches. The gap of a run is the max over those
//   steps of |smooth_run - smooth_base| / max(|smooth_base|, 1e-12); the baseline's own gap is 0.
//   Single-batch losses would measure batch noise.
// - Warnings (comparison_warnings()) name every run whose [model], [data] or run.seed differs
//   from the baseline's, key by key, and runs whose setup cannot be checked; precision, scaler,
//   optimizer and backend differences are what a comparison is for and are not warned about.
// - Each run's escalations (promotions, demotions, ops stuck at fp32) are listed under the table
//   in the text and markdown, in diagnostics_text(), and per run in the JSON.
// - The text, markdown and JSON renderings hold the same numbers and warnings; throughput of a run
//   whose GEMMs ran an emulated dtype is marked "emulated". write_comparison() writes exactly
//   compare.json, compare.md and compare.svg into a folder and nothing else.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/core/runs/component_history.h"

namespace mixtrain::core {

// One logged training step of metrics.jsonl. A non-finite loss is stored as NaN (JSON null).
struct RunStepRecord {
  std::int64_t step = 0;
  double loss = 0.0;
  double loss_scale = 1.0;
  double next_loss_scale = 1.0;
  bool skipped = false;
  double samples_per_s = 0.0;
};

struct RunEvalRecord {
  std::int64_t step = 0;
  double loss = 0.0;
  double accuracy = 0.0;
};

struct RunData {
  std::filesystem::path dir;
  std::string name;  // the folder name, made unique among compared runs by compare_runs()
  std::string policy = "?", scaler = "?", optimizer = "?", backend = "?";
  bool has_summary = false;
  std::vector<RunStepRecord> steps;  // in file order
  std::vector<RunEvalRecord> evals;
  // From summary.json when present, else derived from the records (peak memory: summary only).
  std::int64_t steps_run = 0;
  std::int64_t skipped_steps = 0;
  std::optional<double> final_loss, eval_loss, eval_accuracy, samples_per_s;
  std::optional<double> peak_memory_bytes;
  // Diagnostics records: per FP8 operand slot the worst saturated / underflowed share and the
  // last scale; per tensor the worst share of activation gradients flushed to zero.
  struct Fp8Slot {
    std::string dtype;
    double max_saturated_share = 0.0, max_underflow_share = 0.0, last_scale = 1.0;
  };
  std::map<std::string, Fp8Slot> fp8_slots;
  std::map<std::string, double> max_gradient_underflow;
  // Automatic escalation's records ([precision.escalate]), in file order: "promote", "demote" or
  // "stuck" (an op already fp32); from/to are precision_text() of its plan.
  struct Escalation {
    std::int64_t step = 0;
    std::string kind, node, from, to;
    std::string text() const;  // "proj fp16 -> fp32 at step 3" ("... already fp32" when stuck)
  };
  std::vector<Escalation> escalations;
  // summary.json "precision": the policy that applied ("" when not recorded) and, per GEMM input
  // dtype of the plan, whether the backend ran it natively and how.
  std::string resolved_policy;
  // summary.json "segments": the components by range of steps when a resume changed one.
  ComponentHistory segments;
  struct GemmInput {
    bool native = false;
    std::string how;
  };
  std::map<std::string, GemmInput> gemm_inputs;
  // config.toml's [model], [data] and run.seed, flattened ("data.rows" -> "8192",
  // "model.layers[0].out"
  // -> "128"); nullopt when the folder has no readable config.toml.
  std::optional<std::map<std::string, std::string>> setup;

  // "auto→bf16-mixed" when the policy resolved to another one, else the policy; a run whose
  // policy a resume switched names each with the step it began at ("fp32→fp16-mixed@21").
  std::string policy_label() const;
  std::string scaler_label() const;  // likewise: "none→dynamic@21"
  std::string label() const { return name + " (" + policy_label() + "/" + scaler_label() + ")"; }
  // GEMM input dtypes the backend emulated; empty when all ran natively or nothing was recorded.
  std::vector<std::string> emulated_gemm_inputs() const;
};

// One [model]/[data] key whose value differs from the baseline's; "(absent)" where a side has
// no such key.
struct SetupDifference {
  std::string key, baseline, run;
};

struct RunComparisonRow {
  std::string name, label;
  std::optional<double> final_loss;
  std::optional<double> best_loss;
  std::optional<std::int64_t> best_loss_step;
  std::optional<double> eval_accuracy, eval_accuracy_delta_points, eval_loss, eval_loss_rel_delta;
  std::optional<double> max_rel_loss_gap;
  std::optional<std::int64_t> max_rel_loss_gap_step;
  std::int64_t common_steps = 0;      // steps logged with finite losses by both run and baseline
  std::int64_t smoothed_steps = 0;    // of those, the ones with a full window: the gap's points
  std::int64_t gap_window_steps = 0;  // W of its gap (the baseline's W when it logs as it does)
  // [model]/[data] keys that differ from the baseline's; nullopt when either has no config.toml.
  std::optional<std::vector<SetupDifference>> setup_differences;
  std::int64_t skipped_steps = 0;
  std::optional<double> loss_scale_min, loss_scale_max;
  std::optional<double> samples_per_s, samples_per_s_ratio;
  bool samples_per_s_emulated = false;  // some GEMM input dtype of the run was emulated
  std::optional<double> peak_memory_mib, peak_memory_ratio;
};

// Loss curves are smoothed over this many of the baseline's logging intervals.
inline constexpr int kLossSmoothingIntervals = 5;

struct RunComparison {
  std::vector<RunData> runs;  // runs[0] is the baseline
  std::vector<RunComparisonRow> rows;
  std::int64_t logging_interval = 1;  // the baseline's usual steps between logged losses
  std::int64_t smoothing_window_steps() const { return kLossSmoothingIntervals * logging_interval; }
};

RunData load_run(const std::filesystem::path& dir);
RunComparison compare_runs(const std::vector<std::filesystem::path>& dirs);
RunComparison compare_runs(std::vector<RunData> runs);

// step -> smoothed training loss of one run, as the loss gap uses it: at each step s it logged a
// finite loss, the mean of its finite losses in (s - W, s], W = kLossSmoothingIntervals *
// logging_interval; steps before its first full window (first logged step + W - interval) have
// none.
std::map<std::int64_t, double> smoothed_losses(const RunData& run, std::int64_t logging_interval);
// Both runs' smoothed losses, {run, base}, at each step where both have one, over the steps both
// logged a finite loss, with W from their usual common interval (window_steps).
struct SmoothedPair {
  std::map<std::int64_t, std::pair<double, double>> at;
  std::int64_t window_steps = kLossSmoothingIntervals;
};
SmoothedPair smoothed_common_losses(const RunData& base, const RunData& run);
// One line per problem: runs whose [model]/[data] differ from the baseline's or cannot be checked.
std::vector<std::string> comparison_warnings(const RunComparison& c);

std::string comparison_text(const RunComparison& c);  // aligned table for a terminal
// Each run's diagnostics (FP8 operand slots, gradient underflow shares >= 0.05%); empty: none.
std::string diagnostics_text(const RunComparison& c);
std::string comparison_markdown(const RunComparison& c);  // a GitHub markdown table
std::string comparison_json(const RunComparison& c);      // {"baseline": name, "runs": [...]}
// Panels over step: loss per run (skipped steps crossed); with two or more runs, each run's
// smoothed loss minus the baseline's; eval accuracy per run, when any run evaluated; loss scale
// per run (log2 axis).
std::string comparison_svg(const RunComparison& c);

inline constexpr const char* kCompareOutputNames[] = {"compare.json", "compare.md", "compare.svg"};

// Writes compare.json, compare.md and compare.svg into out_dir (created if missing, but not its
// parent: sdk::UserError, as `predict` and `export` refuse an --out in a missing folder) and
// returns their paths. A non-folder at out_dir, or a folder where one of the three files goes,
// is refused. All or nothing: the three are written whole under staging
// names (.compare.json.staged, ...) and only then renamed into place, so a failure (a full disk)
// leaves the previous three as they were and no staging file behind.
std::vector<std::filesystem::path> write_comparison(const RunComparison& c,
                                                    const std::filesystem::path& out_dir);

}  // namespace mixtrain::core
