// compare_runs(): the rows of a comparison (smoothed losses, loss gaps, setup differences,
// ratios to the baseline) and its warnings.
#include "mixtrain/core/runs/comparison.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "console/short_list.h"
#include "mixtrain/sdk/error.h"
#include "runs/comparison_internal.h"

namespace mixtrain::core {

namespace fs = std::filesystem;

// step -> loss, finite losses only; a step logged twice keeps its last record.
std::map<std::int64_t, double> finite_losses(const RunData& run) {
  std::map<std::int64_t, double> m;
  for (const auto& r : run.steps) {
    if (std::isfinite(r.loss))
      m[r.step] = r.loss;
    else
      m.erase(r.step);
  }
  return m;
}

namespace {

// The baseline's usual distance between logged steps: the most frequent one (a skipped step is
// logged off that grid). 1 when it logged fewer than two steps.
std::int64_t usual_logging_interval(const std::map<std::int64_t, double>& losses) {
  std::map<std::int64_t, int> count;
  std::optional<std::int64_t> prev;
  for (const auto& [step, loss] : losses) {
    if (prev) ++count[step - *prev];
    prev = step;
  }
  std::int64_t best = 1;
  int seen = 0;
  for (const auto& [d, n] : count)
    if (n > seen) best = d, seen = n;
  return best;
}

std::vector<SetupDifference> setup_differences(const std::map<std::string, std::string>& base,
                                               const std::map<std::string, std::string>& run) {
  constexpr const char* kAbsent = "(absent)";
  std::vector<SetupDifference> out;
  auto b = base.begin(), r = run.begin();
  while (b != base.end() || r != run.end()) {
    if (r == run.end() || (b != base.end() && b->first < r->first)) {
      out.push_back({b->first, b->second, kAbsent});
      ++b;
    } else if (b == base.end() || r->first < b->first) {
      out.push_back({r->first, kAbsent, r->second});
      ++r;
    } else {
      if (b->second != r->second) out.push_back({b->first, b->second, r->second});
      ++b, ++r;
    }
  }
  return out;
}

std::optional<double> ratio(const std::optional<double>& a, const std::optional<double>& b) {
  if (!a || !b || !std::isfinite(*a) || !std::isfinite(*b) || *b <= 0) return std::nullopt;
  return *a / *b;
}

}  // namespace

namespace {

std::map<std::int64_t, double> smoothed(const std::map<std::int64_t, double>& raw,
                                        std::int64_t logging_interval) {
  std::map<std::int64_t, double> out;
  if (raw.empty()) return out;
  const std::int64_t window = kLossSmoothingIntervals * logging_interval;
  // A partial window at the start would be a single batch again: begin at the first full one.
  const std::int64_t first_full = raw.begin()->first + window - logging_interval;
  auto lo = raw.begin();
  for (auto it = raw.begin(); it != raw.end(); ++it) {
    while (lo->first <= it->first - window) ++lo;
    if (it->first < first_full) continue;
    double sum = 0.0;
    int n = 0;
    for (auto w = lo; w != std::next(it); ++w) sum += w->second, ++n;
    out[it->first] = sum / n;
  }
  return out;
}

}  // namespace

std::map<std::int64_t, double> smoothed_losses(const RunData& run, std::int64_t logging_interval) {
  return smoothed(finite_losses(run), logging_interval);
}

SmoothedPair smoothed_common_losses(const RunData& base, const RunData& run) {
  const auto b = finite_losses(base), r = finite_losses(run);
  std::map<std::int64_t, double> common_base, common_run;
  for (const auto& [step, loss] : b)
    if (const auto it = r.find(step); it != r.end())
      common_base[step] = loss, common_run[step] = it->second;
  SmoothedPair out;
  const std::int64_t interval = usual_logging_interval(common_base);
  out.window_steps = kLossSmoothingIntervals * interval;
  const auto sb = smoothed(common_base, interval), sr = smoothed(common_run, interval);
  for (const auto& [step, loss] : sr) out.at[step] = {loss, sb.at(step)};
  return out;
}

std::vector<std::string> comparison_warnings(const RunComparison& c) {
  std::vector<std::string> out;
  std::vector<std::string> unchecked;
  for (std::size_t i = 0; i < c.rows.size(); ++i) {
    const auto& row = c.rows[i];
    if (!c.runs[i].setup) unchecked.push_back(row.name);
    // Final and best losses of runs of different lengths are different points of training.
    if (i > 0 && c.runs[i].steps_run != c.runs[0].steps_run)
      out.push_back(row.name + " ran " + std::to_string(c.runs[i].steps_run) +
                    " steps, the baseline " + std::to_string(c.runs[0].steps_run) +
                    ": its final and best losses are from another point of training; compare "
                    "the loss curves at common steps");
    if (i == 0 || !row.setup_differences || row.setup_differences->empty()) continue;
    const auto& diffs = *row.setup_differences;
    constexpr std::size_t kShown = 4;  // enough to see what changed; compare.json lists all
    std::vector<std::string> differences;
    for (const auto& d : diffs)
      differences.push_back(d.key + " = " + d.run + " (baseline " + d.baseline + ")");
    out.push_back(row.name + " trains a different model or data than the baseline: " +
                  short_list(differences, kShown) +
                  "; its loss and accuracy differences are not a precision effect");
  }
  if (!unchecked.empty() && c.rows.size() > 1) {
    std::string names;
    for (const auto& n : unchecked) names += (names.empty() ? "" : ", ") + n;
    out.push_back(
        "cannot check that the runs train the same model on the same data: no readable config.toml "
        "in " +
        names);
  }
  return out;
}

RunComparison compare_runs(const std::vector<fs::path>& dirs) {
  if (dirs.empty())
    throw sdk::UserError(
        "compare needs at least one run folder",
        "mixtrain compare BASELINE_RUN [OTHER_RUN...]: the first folder is the baseline");
  std::vector<RunData> runs;
  for (const auto& d : dirs) runs.push_back(load_run(d));
  return compare_runs(std::move(runs));
}

RunComparison compare_runs(std::vector<RunData> runs) {
  if (runs.empty())
    throw sdk::UserError(
        "compare needs at least one run folder",
        "mixtrain compare BASELINE_RUN [OTHER_RUN...]: the first folder is the baseline");
  // Same-named folders from different parents (a/run, b/run) must stay distinguishable.
  std::map<std::string, int> seen;
  for (const auto& r : runs) ++seen[r.name];
  for (auto& r : runs)
    if (seen[r.name] > 1) {
      auto parent = fs::absolute(r.dir).lexically_normal().parent_path().filename().string();
      if (!parent.empty()) r.name = parent + "/" + r.name;
    }
  std::set<std::string> used;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    std::string n = runs[i].name;
    for (int k = 2; used.count(n) != 0; ++k) n = runs[i].name + "#" + std::to_string(k);
    runs[i].name = n;
    used.insert(n);
  }

  RunComparison c;
  c.logging_interval = usual_logging_interval(finite_losses(runs.front()));
  for (const auto& run : runs) {
    RunComparisonRow row;
    row.name = run.name;
    row.label = run.label();
    row.final_loss = run.final_loss;
    row.eval_accuracy = run.eval_accuracy;
    row.eval_loss = run.eval_loss;
    row.skipped_steps = run.skipped_steps;
    row.samples_per_s = run.samples_per_s;
    if (run.peak_memory_bytes) row.peak_memory_mib = *run.peak_memory_bytes / (1024.0 * 1024.0);

    row.samples_per_s_emulated = !run.emulated_gemm_inputs().empty();
    if (run.setup && runs.front().setup)
      row.setup_differences = setup_differences(*runs.front().setup, *run.setup);

    for (const auto& [step, loss] : finite_losses(run))
      if (!row.best_loss || loss < *row.best_loss) row.best_loss = loss, row.best_loss_step = step;
    // Single-batch losses differ by batch noise alone; the smoothed curves differ by what the runs
    // do differently. Both are averaged over the same steps (those both logged), so runs logged
    // at different intervals compare means of the same batches.
    const auto base_losses = finite_losses(runs.front());
    for (const auto& [step, loss] : finite_losses(run)) row.common_steps += base_losses.count(step);
    const SmoothedPair pair = smoothed_common_losses(runs.front(), run);
    row.gap_window_steps = pair.window_steps;
    for (const auto& [step, losses] : pair.at) {
      const auto [loss, base_loss] = losses;
      ++row.smoothed_steps;
      const double gap = std::fabs(loss - base_loss) / std::max(std::fabs(base_loss), 1e-12);
      if (!row.max_rel_loss_gap || gap > *row.max_rel_loss_gap)
        row.max_rel_loss_gap = gap, row.max_rel_loss_gap_step = step;
    }
    for (const auto& r : run.steps)
      if (std::isfinite(r.loss_scale) && r.loss_scale > 0) {
        row.loss_scale_min = std::min(row.loss_scale_min.value_or(r.loss_scale), r.loss_scale);
        row.loss_scale_max = std::max(row.loss_scale_max.value_or(r.loss_scale), r.loss_scale);
      }
    c.rows.push_back(std::move(row));
  }
  const auto& base = c.rows.front();
  for (auto& row : c.rows) {
    if (row.eval_accuracy && base.eval_accuracy && std::isfinite(*row.eval_accuracy) &&
        std::isfinite(*base.eval_accuracy))
      row.eval_accuracy_delta_points = (*row.eval_accuracy - *base.eval_accuracy) * 100.0;
    if (row.eval_loss && base.eval_loss && std::isfinite(*row.eval_loss) &&
        std::isfinite(*base.eval_loss))
      row.eval_loss_rel_delta =
          (*row.eval_loss - *base.eval_loss) / std::max(std::fabs(*base.eval_loss), 1e-12);
    row.samples_per_s_ratio = ratio(row.samples_per_s, base.samples_per_s);
    row.peak_memory_ratio = ratio(row.peak_memory_mib, base.peak_memory_mib);
  }
  c.runs = std::move(runs);
  return c;
}

}  // namespace mixtrain::core
