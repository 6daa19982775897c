// Run comparison: the parity check of several training runs against a baseline (the first run).
//
// Contract
// - load_run() reads one run folder written by `mixtrain train`: metrics.jsonl (required) and
//   summary.json (optional: an interrupted run has none, and its values are then derived from
//   metrics.jsonl; peak memory is then unknown). Policy and scaler come from summary.json, else
//   from config.toml. Bad input raises sdk::UserError (folder missing) or sdk::DataError
//   (metrics.jsonl missing, a malformed record — the message names file:line).
// - compare_runs() computes one row per run; values that cannot be known are std::nullopt.
//   The loss gap of a run is max over the steps both it and the baseline logged with finite
//   losses of |loss_run - loss_base| / max(|loss_base|, 1e-12); the baseline's own gap is 0.
// - The text, markdown and JSON renderings hold the same numbers; write_comparison() writes
//   exactly compare.json, compare.md and compare.svg into a folder and nothing else.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <map>
#include <vector>

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

  std::string label() const { return name + " (" + policy + "/" + scaler + ")"; }
};

struct RunComparisonRow {
  std::string name, label;
  std::optional<double> final_loss;
  std::optional<double> best_loss;
  std::optional<std::int64_t> best_loss_step;
  std::optional<double> eval_accuracy, eval_accuracy_delta_points, eval_loss;
  std::optional<double> max_rel_loss_gap;
  std::optional<std::int64_t> max_rel_loss_gap_step;
  std::int64_t common_steps = 0;  // steps logged with finite losses by both run and baseline
  std::int64_t skipped_steps = 0;
  std::optional<double> loss_scale_min, loss_scale_max;
  std::optional<double> samples_per_s, samples_per_s_ratio;
  std::optional<double> peak_memory_mib, peak_memory_ratio;
};

struct RunComparison {
  std::vector<RunData> runs;  // runs[0] is the baseline
  std::vector<RunComparisonRow> rows;
};

RunData load_run(const std::filesystem::path& dir);
RunComparison compare_runs(const std::vector<std::filesystem::path>& dirs);
RunComparison compare_runs(std::vector<RunData> runs);

std::string comparison_text(const RunComparison& c);      // aligned table for a terminal
// The diagnostics of each run (FP8 operand slots, gradient underflow); empty when none logged.
std::string diagnostics_text(const RunComparison& c);
std::string comparison_markdown(const RunComparison& c);  // a GitHub markdown table
std::string comparison_json(const RunComparison& c);      // {"baseline": name, "runs": [...]}
// Two panels over step: loss per run (skipped steps crossed) and loss scale per run (log2 axis).
std::string comparison_svg(const RunComparison& c);

inline constexpr const char* kCompareOutputNames[] = {"compare.json", "compare.md", "compare.svg"};

// Writes compare.json, compare.md and compare.svg into out_dir (created if missing) and returns
// their paths. A non-folder at out_dir, or a folder where one of the three files goes, is refused.
std::vector<std::filesystem::path> write_comparison(const RunComparison& c,
                                                    const std::filesystem::path& out_dir);

}  // namespace mixtrain::core
