#include "mixtrain/core/run_comparison.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <toml++/toml.h>
#include <nlohmann/json.hpp>

#include "mixtrain/core/log_sink.h"
#include "mixtrain/core/svg_chart.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr const char* kRunFolderHint =
    "pass folders written by `mixtrain train --run-dir DIR` (each holds metrics.jsonl)";

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw sdk::DataError("cannot read " + p.string(), "check the file's permissions");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A number that JSON may hold as null (how the trainer writes a non-finite value): NaN then.
double number_or_nan(const json& j, const char* key, const std::string& where, double fallback) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (it->is_null()) return kNaN;
  if (!it->is_number())
    throw sdk::DataError(
        where + ": '" + key + "' is " + it->dump() + ", not a number",
        "the file is damaged or was not written by mixtrain; fix or remove that record");
  return it->get<double>();
}

// Steps beyond this are damage, not training: the bound keeps the step arithmetic below
// (intervals, smoothing windows) far from overflow.
constexpr std::int64_t kMaxStep = std::int64_t{1} << 50;

std::int64_t required_step(const json& j, const std::string& where) {
  auto it = j.find("step");
  if (it == j.end() || !it->is_number_integer())
    throw sdk::DataError(
        where + ": record without an integer 'step': " + j.dump(),
        "the file is damaged or was not written by mixtrain; fix or remove that record");
  const bool in_range = it->is_number_unsigned()
                            ? it->get<std::uint64_t>() <= kMaxStep
                            : it->get<std::int64_t>() >= 0 && it->get<std::int64_t>() <= kMaxStep;
  if (!in_range)
    throw sdk::DataError(
        where + ": 'step' is " + it->dump() + ", outside [0, 2^50]",
        "the file is damaged or was not written by mixtrain; fix or remove that record");
  return it->get<std::int64_t>();
}

// A count from summary.json, or nullopt when absent, not finite or out of [0, kMaxStep].
std::optional<std::int64_t> step_count(std::optional<double> v) {
  if (!v || !std::isfinite(*v) || *v < 0 || *v > static_cast<double>(kMaxStep)) return std::nullopt;
  return static_cast<std::int64_t>(*v);
}

void read_metrics(RunData& run, const fs::path& file) {
  const std::string text = read_text(file);
  std::size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    const std::size_t end = text.find('\n', pos);
    const bool terminated = end != std::string::npos;
    const std::string line = text.substr(pos, terminated ? end - pos : std::string::npos);
    pos = terminated ? end + 1 : text.size();
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = file.string() + ":" + std::to_string(line_no);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::parse_error& e) {
      // A run killed mid-write leaves a torn last line; the rest of its history is still good.
      if (!terminated && !run.has_summary) {
        core_logger("compare").warn(where +
                                    ": ignoring the unfinished last record of an interrupted run");
        break;
      }
      throw sdk::DataError(
          where + ": malformed metrics record (" + std::string(e.what()) + ")",
          "fix or delete that line of metrics.jsonl; every line must be one JSON object");
    }
    if (!j.is_object())
      throw sdk::DataError(where + ": a metrics record must be a JSON object, got " + j.dump(),
                           "fix or delete that line of metrics.jsonl");
    if (j.contains("loss")) {
      RunStepRecord r;
      r.step = required_step(j, where);
      r.loss = number_or_nan(j, "loss", where, kNaN);
      r.loss_scale = number_or_nan(j, "loss_scale", where, 1.0);
      r.next_loss_scale = number_or_nan(j, "next_loss_scale", where, r.loss_scale);
      r.samples_per_s = number_or_nan(j, "samples_per_s", where, 0.0);
      if (auto it = j.find("skipped"); it != j.end()) {
        if (!it->is_boolean())
          throw sdk::DataError(where + ": 'skipped' is " + it->dump() + ", not true/false",
                               "fix or delete that line of metrics.jsonl");
        r.skipped = it->get<bool>();
      }
      run.steps.push_back(r);
    } else if (j.contains("eval_loss") || j.contains("eval_accuracy")) {
      RunEvalRecord r;
      r.step = required_step(j, where);
      r.loss = number_or_nan(j, "eval_loss", where, kNaN);
      r.accuracy = number_or_nan(j, "eval_accuracy", where, kNaN);
      run.evals.push_back(r);
    }
    if (auto it = j.find("fp8"); it != j.end() && it->is_object())
      for (const auto& [slot, v] : it->items()) {
        if (!v.is_object()) continue;
        auto& d = run.fp8_slots[slot];
        d.dtype = v.value("dtype", d.dtype);
        d.max_saturated_share = std::max(d.max_saturated_share, v.value("saturated_share", 0.0));
        d.max_underflow_share = std::max(d.max_underflow_share, v.value("underflow_share", 0.0));
        d.last_scale = v.value("scale", d.last_scale);
      }
    if (auto it = j.find("underflow"); it != j.end() && it->is_object())
      for (const auto& [tensor, v] : it->items())
        if (v.is_object()) {
          auto& worst = run.max_gradient_underflow[tensor];
          worst = std::max(worst, v.value("flushed_share", 0.0));
        }
    // Other records are from a newer writer; skipping them keeps old readers useful.
  }
}

void read_summary(RunData& run, const fs::path& file) {
  json j;
  try {
    j = json::parse(read_text(file));
  } catch (const json::parse_error& e) {
    throw sdk::DataError(
        file.string() + ": malformed summary (" + std::string(e.what()) + ")",
        "delete summary.json to have compare derive the values from metrics.jsonl");
  }
  if (!j.is_object())
    throw sdk::DataError(
        file.string() + ": the summary must be a JSON object",
        "delete summary.json to have compare derive the values from metrics.jsonl");
  const std::string where = file.string();
  auto opt = [&](const char* key) -> std::optional<double> {
    if (!j.contains(key)) return std::nullopt;
    return number_or_nan(j, key, where, kNaN);
  };
  auto str = [&](const char* key, std::string& into) {
    if (auto it = j.find(key); it != j.end() && it->is_string()) into = it->get<std::string>();
  };
  run.has_summary = true;
  if (auto v = step_count(opt("steps"))) run.steps_run = *v;
  if (auto v = step_count(opt("skipped_steps"))) run.skipped_steps = *v;
  run.final_loss = opt("final_loss");
  run.eval_loss = opt("eval_loss");
  run.eval_accuracy = opt("eval_accuracy");
  run.samples_per_s = opt("samples_per_s");
  run.peak_memory_bytes = opt("peak_memory_bytes");
  str("policy", run.policy);
  str("scaler", run.scaler);
  str("optimizer", run.optimizer);
  str("backend", run.backend);
  // Written by trainers since the "precision" record exists; older summaries simply lack it.
  if (auto p = j.find("precision"); p != j.end() && p->is_object()) {
    if (auto it = p->find("policy"); it != p->end() && it->is_string())
      run.resolved_policy = it->get<std::string>();
    if (auto g = p->find("gemm_inputs"); g != p->end() && g->is_object())
      for (const auto& [dtype, v] : g->items())
        if (v.is_object())
          run.gemm_inputs[dtype] = {v.value("native", false), v.value("how", std::string())};
  }
}

// Every leaf under `node` as "prefix.key" / "prefix[i]" -> its TOML spelling. Generic on purpose:
// whatever sub-tables a section gains (say [data.synthetic]) take part without a change here.
void flatten_toml(const toml::node& node, const std::string& prefix,
                  std::map<std::string, std::string>& out) {
  if (const auto* t = node.as_table()) {
    for (const auto& [k, v] : *t) flatten_toml(v, prefix + "." + std::string(k.str()), out);
  } else if (const auto* a = node.as_array()) {
    for (std::size_t i = 0; i < a->size(); ++i)
      flatten_toml(*a->get(i), prefix + "[" + std::to_string(i) + "]", out);
  } else {
    std::ostringstream os;
    node.visit([&](const auto& v) { os << v; });
    out[prefix] = os.str();
  }
}

// The sections that decide what is learned from what; the rest of a config is what runs vary.
constexpr const char* kSetupSections[] = {"model", "data"};

// Labels and the setup only: an unreadable config.toml leaves labels "?" and the setup unknown
// rather than failing the comparison.
void read_config(RunData& run, const fs::path& file) {
  if (!fs::exists(file)) return;
  try {
    auto tbl = toml::parse_file(file.string());
    auto take = [](std::string& into, std::optional<std::string> v) {
      if (into == "?" && v) into = *v;
    };
    take(run.policy, tbl["precision"]["policy"].value<std::string>());
    take(run.scaler, tbl["scaler"]["type"].value<std::string>());
    take(run.optimizer, tbl["optimizer"]["type"].value<std::string>());
    take(run.backend, tbl["backend"]["type"].value<std::string>());
    std::map<std::string, std::string> setup;
    for (const char* section : kSetupSections)
      if (const auto* node = tbl.get(section)) flatten_toml(*node, section, setup);
    // The seed draws the synthetic data and the held-out split: runs with different seeds train
    // and evaluate on different data, which is not a precision effect.
    if (const auto* seed = tbl.at_path("run.seed").node()) flatten_toml(*seed, "run.seed", setup);
    run.setup = std::move(setup);
  } catch (const toml::parse_error&) {
  }
}

void derive_from_records(RunData& run) {
  if (run.has_summary) return;
  for (const auto& r : run.steps) run.steps_run = std::max(run.steps_run, r.step);
  for (const auto& r : run.evals) run.steps_run = std::max(run.steps_run, r.step);
  run.skipped_steps =
      std::count_if(run.steps.begin(), run.steps.end(), [](const auto& r) { return r.skipped; });
  if (!run.steps.empty()) run.final_loss = run.steps.back().loss;
  if (!run.evals.empty()) {
    run.eval_loss = run.evals.back().loss;
    run.eval_accuracy = run.evals.back().accuracy;
  }
  // Every record holds the throughput of its own logging window; their mean is the run's.
  double sum = 0.0;
  int n = 0;
  for (const auto& r : run.steps)
    if (std::isfinite(r.samples_per_s) && r.samples_per_s > 0) sum += r.samples_per_s, ++n;
  if (n > 0) run.samples_per_s = sum / n;
}

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

// ---- rendering -----------------------------------------------------------------------------

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Losses: five decimals while that keeps about four significant digits, else scientific.
std::string num(const std::optional<double>& v, const char* f = nullptr) {
  if (!v) return "-";
  if (std::isnan(*v)) return "nan";
  if (std::isinf(*v)) return *v > 0 ? "inf" : "-inf";
  if (f != nullptr) return fmt(f, *v);
  const double a = std::fabs(*v);
  return fmt(a == 0.0 || (a >= 1e-2 && a < 1e5) ? "%.5f" : "%.4e", *v);
}

std::string with_step(const std::string& value, const std::optional<std::int64_t>& step) {
  return step ? value + " @" + std::to_string(*step) : value;
}

// Loss scales are usually powers of two: 2^24 says more than 1.67772e+07.
std::string scale_value(double v) {
  int e = 0;
  if (std::isfinite(v) && std::frexp(v, &e) == 0.5 && (e - 1 > 16 || e - 1 < -4))
    return "2^" + std::to_string(e - 1);
  return fmt("%.6g", v);
}

std::string scale_range(const RunComparisonRow& r) {
  if (!r.loss_scale_min) return "-";
  if (*r.loss_scale_min == *r.loss_scale_max) return scale_value(*r.loss_scale_min);
  return scale_value(*r.loss_scale_min) + ".." + scale_value(*r.loss_scale_max);
}

std::string with_ratio(const std::string& value, const std::optional<double>& ratio,
                       bool baseline) {
  if (baseline || !ratio) return value;
  return value + " (" + fmt("%.2f", *ratio) + "x)";
}

bool shares_logged_steps(const RunData& a, const RunData& b) {
  const auto la = finite_losses(a), lb = finite_losses(b);
  return std::any_of(la.begin(), la.end(), [&](const auto& kv) { return lb.count(kv.first) != 0; });
}

// Table cells shared by the terminal and markdown renderings, so both always agree.
std::vector<std::vector<std::string>> table_cells(const RunComparison& c) {
  std::vector<std::vector<std::string>> t;
  t.push_back({"run", "final loss", "best loss", "eval acc", "eval loss",
               "max gap, " + std::to_string(c.smoothing_window_steps()) + "-step mean loss",
               "skipped", "loss scale", "samples/s", "peak MiB"});
  for (std::size_t i = 0; i < c.rows.size(); ++i) {
    const auto& r = c.rows[i];
    const bool base = i == 0;
    std::string acc = num(r.eval_accuracy, "%.4f");
    if (!base && r.eval_accuracy_delta_points)
      acc += " (" + fmt("%+.2f", *r.eval_accuracy_delta_points) + " pts)";
    std::string gap;
    if (base)
      gap = "(baseline)";
    else if (!r.max_rel_loss_gap)
      gap = shares_logged_steps(c.runs[0], c.runs[i]) ? "too short to smooth" : "no common steps";
    else
      gap = with_step(fmt("%.2f%%", *r.max_rel_loss_gap * 100.0), r.max_rel_loss_gap_step);
    std::string eval_loss = num(r.eval_loss);
    if (!base && r.eval_loss_rel_delta)
      eval_loss += " (" + fmt("%+.2f%%", *r.eval_loss_rel_delta * 100.0) + ")";
    std::string speed = with_ratio(num(r.samples_per_s, "%.0f"), r.samples_per_s_ratio, base);
    // An emulated format's speed is the emulation's, not the format's on hardware that has it.
    if (r.samples_per_s && r.samples_per_s_emulated) speed += " emulated";
    t.push_back({r.label, num(r.final_loss), with_step(num(r.best_loss), r.best_loss_step), acc,
                 eval_loss, gap, std::to_string(r.skipped_steps), scale_range(r), speed,
                 with_ratio(num(r.peak_memory_mib, "%.1f"), r.peak_memory_ratio, base)});
  }
  return t;
}

// Terminal columns: UTF-8 continuation bytes take no width (run names may be non-ASCII).
std::size_t display_width(const std::string& s) {
  return static_cast<std::size_t>(std::count_if(
      s.begin(), s.end(), [](char ch) { return (static_cast<unsigned char>(ch) & 0xC0) != 0x80; }));
}

std::string gap_note(const RunComparison& c) {
  return "max gap: the largest |L - L_baseline| / |L_baseline| over the steps both runs logged, "
         "and "
         "its step; L is the training loss averaged over the trailing " +
         std::to_string(c.smoothing_window_steps()) + " steps (" +
         std::to_string(kLossSmoothingIntervals) +
         " of the baseline's logging intervals; from the first full window on), not a single "
         "batch's";
}

// One line per run whose throughput was measured on emulated GEMM formats.
std::vector<std::string> emulation_notes(const RunComparison& c) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < c.runs.size(); ++i) {
    if (!c.rows[i].samples_per_s_emulated) continue;
    std::string what;
    for (const auto& d : c.runs[i].emulated_gemm_inputs())
      what += (what.empty() ? "" : "; ") + d + " GEMMs " + c.runs[i].gemm_inputs.at(d).how;
    out.push_back(c.runs[i].name + ": " + what);
  }
  return out;
}

json opt_json(const std::optional<double>& v) {
  return v ? json(*v) : json(nullptr);
}
json opt_json(const std::optional<std::int64_t>& v) {
  return v ? json(*v) : json(nullptr);
}

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

}  // namespace

std::string RunData::policy_label() const {
  if (resolved_policy.empty() || resolved_policy == policy) return policy;
  return policy + "\u2192" + resolved_policy;
}

std::vector<std::string> RunData::emulated_gemm_inputs() const {
  std::vector<std::string> out;
  for (const auto& [dtype, g] : gemm_inputs)
    if (!g.native) out.push_back(dtype);
  return out;
}

std::map<std::int64_t, double> smoothed_losses(const RunData& run, std::int64_t logging_interval) {
  const auto raw = finite_losses(run);
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

std::vector<std::string> comparison_warnings(const RunComparison& c) {
  std::vector<std::string> out;
  std::vector<std::string> unchecked;
  for (std::size_t i = 0; i < c.rows.size(); ++i) {
    const auto& row = c.rows[i];
    if (!c.runs[i].setup) unchecked.push_back(row.name);
    if (i == 0 || !row.setup_differences || row.setup_differences->empty()) continue;
    const auto& diffs = *row.setup_differences;
    constexpr std::size_t kShown = 4;  // enough to see what changed; compare.json lists all
    std::string list;
    for (std::size_t k = 0; k < diffs.size() && k < kShown; ++k)
      list += (k == 0 ? "" : ", ") + diffs[k].key + " = " + diffs[k].run + " (baseline " +
              diffs[k].baseline + ")";
    if (diffs.size() > kShown) list += " and " + std::to_string(diffs.size() - kShown) + " more";
    out.push_back(row.name + " trains a different model or data than the baseline: " + list +
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

RunData load_run(const fs::path& dir) {
  if (!fs::exists(dir)) throw sdk::UserError(dir.string() + ": no such run folder", kRunFolderHint);
  if (!fs::is_directory(dir)) throw sdk::UserError(dir.string() + ": not a folder", kRunFolderHint);
  RunData run;
  run.dir = dir;
  run.name = fs::absolute(dir).lexically_normal().filename().string();
  if (run.name.empty())
    run.name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
  const auto metrics = dir / "metrics.jsonl";
  if (!fs::exists(metrics))
    throw sdk::DataError(
        metrics.string() + ": missing, so " + dir.string() + " is not a run folder",
        kRunFolderHint);
  if (fs::exists(dir / "summary.json")) read_summary(run, dir / "summary.json");
  read_metrics(run, metrics);
  read_config(run, dir / "config.toml");
  derive_from_records(run);
  return run;
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
  const auto base_smoothed = smoothed_losses(runs.front(), c.logging_interval);
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
    // do differently.
    for (const auto& [step, loss] : smoothed_losses(run, c.logging_interval)) {
      auto b = base_smoothed.find(step);
      if (b == base_smoothed.end()) continue;
      ++row.common_steps;
      const double gap = std::fabs(loss - b->second) / std::max(std::fabs(b->second), 1e-12);
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

std::string comparison_text(const RunComparison& c) {
  const auto cells = table_cells(c);
  std::vector<std::size_t> width(cells.front().size(), 0);
  for (const auto& row : cells)
    for (std::size_t k = 0; k < row.size(); ++k)
      width[k] = std::max(width[k], display_width(row[k]));
  std::string out = "parity against the baseline " + c.rows.front().label + " (" +
                    std::to_string(c.rows.size()) + (c.rows.size() == 1 ? " run" : " runs") + ")\n";
  for (std::size_t i = 0; i < cells.size(); ++i) {
    std::string line;
    for (std::size_t k = 0; k < cells[i].size(); ++k) {
      const auto& s = cells[i][k];
      const std::string pad(width[k] - display_width(s), ' ');
      // Text left, numbers right: the eye compares digits column by column.
      line += k == 0 ? s + pad : "  " + pad + s;
    }
    out += line + "\n";
    if (i == 0) {
      std::size_t total = 0;
      for (auto w : width) total += w + 2;
      out += std::string(total - 2, '-') + "\n";
    }
  }
  for (const auto& w : comparison_warnings(c)) out += "warning: " + w + "\n";
  out += gap_note(c) + "\n";
  const auto emulated = emulation_notes(c);
  if (!emulated.empty()) {
    out +=
        "emulated: these runs' samples/s measure an emulation, not the format on hardware that "
        "runs it:\n";
    for (const auto& e : emulated) out += "  " + e + "\n";
  }
  return out;
}

std::string diagnostics_text(const RunComparison& c) {
  std::string out;
  char buf[256];
  for (const auto& run : c.runs) {
    if (run.fp8_slots.empty() && run.max_gradient_underflow.empty()) continue;
    out += run.label() + ":\n";
    for (const auto& [slot, d] : run.fp8_slots) {
      std::snprintf(buf, sizeof buf,
                    "  fp8 %-24s %-9s scale %-12.6g saturated <= %.4f%%  underflow <= %.4f%%\n",
                    slot.c_str(), d.dtype.c_str(), d.last_scale, 100.0 * d.max_saturated_share,
                    100.0 * d.max_underflow_share);
      out += buf;
    }
    // The worst few tensors are what a reader acts on.
    std::vector<std::pair<double, std::string>> worst;
    for (const auto& [t, v] : run.max_gradient_underflow) worst.emplace_back(v, t);
    std::sort(worst.rbegin(), worst.rend());
    for (std::size_t i = 0; i < worst.size() && i < 5; ++i) {
      std::snprintf(buf, sizeof buf,
                    "  gradient underflow %-28s up to %.1f%% of non-zero values flushed\n",
                    worst[i].second.c_str(), 100.0 * worst[i].first);
      out += buf;
    }
  }
  return out;
}

namespace {
// Run names and config values are user text: neither HTML nor markdown syntax may leak from them.
std::string md_escape(const std::string& s) {
  std::string e;
  for (char ch : s) {
    if (ch == '<')
      e += "&lt;";
    else if (ch == '>')
      e += "&gt;";
    else if (ch == '&')
      e += "&amp;";
    else if (ch == '|' || ch == '*' || ch == '_' || ch == '`' || ch == '\\')
      e += std::string("\\") + ch;
    else
      e += ch;
  }
  return e;
}
}  // namespace

std::string comparison_markdown(const RunComparison& c) {
  auto cells = table_cells(c);
  std::string out =
      "# Parity against the baseline\n\nThe first row is the baseline; every other row is compared "
      "with it.\n\n";
  for (const auto& w : comparison_warnings(c)) out += "> **Warning:** " + md_escape(w) + "\n\n";
  for (std::size_t i = 0; i < cells.size(); ++i) {
    out += "|";
    for (auto& s : cells[i]) out += " " + md_escape(s) + " |";
    out += "\n";
    if (i == 0) {
      out += "|:---|";
      for (std::size_t k = 1; k < cells[i].size(); ++k) out += "---:|";
      out += "\n";
    }
  }
  out += "\n" + md_escape(gap_note(c)) + ". Chart: `compare.svg`.\n";
  const auto emulated = emulation_notes(c);
  if (!emulated.empty()) {
    out +=
        "\n*emulated*: these runs' samples/s measure an emulation, not the format on hardware that "
        "runs it:\n\n";
    for (const auto& e : emulated) out += "- " + md_escape(e) + "\n";
  }
  return out;
}

namespace {
json fp8_json(const RunData& d) {
  json out = json::object();
  for (const auto& [slot, v] : d.fp8_slots)
    out[slot] = {{"dtype", v.dtype},
                 {"max_saturated_share", v.max_saturated_share},
                 {"max_underflow_share", v.max_underflow_share},
                 {"last_scale", v.last_scale}};
  return out;
}

json gemm_json(const RunData& d) {
  json out = json::object();
  for (const auto& [dtype, g] : d.gemm_inputs) out[dtype] = {{"native", g.native}, {"how", g.how}};
  return out;
}

json setup_json(const RunComparisonRow& r) {
  if (!r.setup_differences) return nullptr;
  json out = json::array();
  for (const auto& d : *r.setup_differences)
    out.push_back({{"key", d.key}, {"baseline", d.baseline}, {"run", d.run}});
  return out;
}
}  // namespace

std::string comparison_json(const RunComparison& c) {
  json runs = json::array();
  for (std::size_t i = 0; i < c.rows.size(); ++i) {
    const auto& r = c.rows[i];
    const auto& d = c.runs[i];
    runs.push_back(
        {{"name", r.name},
         {"label", r.label},
         {"dir", d.dir.string()},
         {"baseline", i == 0},
         {"has_summary", d.has_summary},
         {"policy", d.policy},
         {"resolved_policy", d.resolved_policy.empty() ? json(nullptr) : json(d.resolved_policy)},
         {"scaler", d.scaler},
         {"optimizer", d.optimizer},
         {"backend", d.backend},
         {"steps", d.steps_run},
         {"final_loss", opt_json(r.final_loss)},
         {"best_loss", opt_json(r.best_loss)},
         {"best_loss_step", opt_json(r.best_loss_step)},
         {"eval_accuracy", opt_json(r.eval_accuracy)},
         {"eval_accuracy_delta_points", opt_json(r.eval_accuracy_delta_points)},
         {"eval_loss", opt_json(r.eval_loss)},
         {"eval_loss_rel_delta", opt_json(r.eval_loss_rel_delta)},
         {"max_rel_loss_gap", opt_json(r.max_rel_loss_gap)},
         {"max_rel_loss_gap_step", opt_json(r.max_rel_loss_gap_step)},
         {"common_steps", r.common_steps},
         {"skipped_steps", r.skipped_steps},
         {"loss_scale_min", opt_json(r.loss_scale_min)},
         {"loss_scale_max", opt_json(r.loss_scale_max)},
         {"samples_per_s", opt_json(r.samples_per_s)},
         {"samples_per_s_ratio", opt_json(r.samples_per_s_ratio)},
         {"samples_per_s_emulated", r.samples_per_s_emulated},
         {"gemm_inputs", gemm_json(d)},
         {"setup_differences", setup_json(r)},
         {"peak_memory_mib", opt_json(r.peak_memory_mib)},
         {"peak_memory_ratio", opt_json(r.peak_memory_ratio)},
         {"fp8_slots", fp8_json(d)},
         {"max_gradient_underflow", d.max_gradient_underflow}});
  }
  // Non-finite numbers have no JSON spelling; nlohmann writes them as null.
  return json{{"baseline", c.rows.front().name},
              {"loss_gap",
               {{"curve", "training loss, trailing mean"},
                {"window_steps", c.smoothing_window_steps()}}},
              {"warnings", comparison_warnings(c)},
              {"runs", runs}}
             .dump(2) +
         "\n";
}

std::string comparison_svg(const RunComparison& c) {
  const std::string window = std::to_string(c.smoothing_window_steps());
  ChartPanel loss{"training loss", "loss", AxisScale::automatic, 260.0, "loss-curve",
                  "skip-marks",    {}};
  ChartPanel diff{"difference from the baseline: smoothed loss minus the baseline's (" + window +
                      "-step trailing mean)",
                  "loss - baseline",
                  AxisScale::linear,
                  160.0,
                  "diff-curve",
                  "diff-marks",
                  {}};
  ChartPanel acc{"eval accuracy", "accuracy", AxisScale::linear, 160.0, "eval-curve",
                 "eval-marks",    {}};
  ChartPanel scale{"loss scale (log2 axis)",
                   "loss scale",
                   AxisScale::log2,
                   140.0,
                   "scale-curve",
                   "scale-marks",
                   {}};
  std::vector<ChartLegendEntry> legend;
  bool any_skipped = false, any_eval = false;
  const auto base_smoothed = smoothed_losses(c.runs.front(), c.logging_interval);
  for (std::size_t i = 0; i < c.runs.size(); ++i) {
    const auto& run = c.runs[i];
    const std::string color = kPalette[i % std::size(kPalette)];
    // The baseline is a wide translucent band under the other curves, so a run that matches it
    // exactly still shows both.
    const double width = i == 0 ? 5.0 : 1.6, opacity = i == 0 ? 0.45 : 1.0;
    ChartSeries ls{color, {}, false, {}, width, opacity}, ss{color, {}, true, {}, width, opacity};
    for (const auto& r : run.steps) {
      ls.points.push_back({static_cast<double>(r.step), r.loss});
      if (r.skipped) ls.marks.push_back({static_cast<double>(r.step), r.loss}), any_skipped = true;
      ss.points.push_back({static_cast<double>(r.step), r.loss_scale});
      // The scaler's decision takes effect right after the step: draw the drop at that step.
      if (r.next_loss_scale != r.loss_scale)
        ss.points.push_back({static_cast<double>(r.step), r.next_loss_scale});
    }
    // Only the steps both logged have a difference; the baseline's own is its zero line.
    ChartSeries ds{color, {}, false, {}, width, opacity};
    for (const auto& [step, smoothed] : smoothed_losses(run, c.logging_interval))
      if (auto b = base_smoothed.find(step); b != base_smoothed.end())
        ds.points.push_back({static_cast<double>(step), smoothed - b->second});
    ChartSeries as{color, {}, false, {}, width, opacity};
    as.dots = true;
    for (const auto& r : run.evals) as.points.push_back({static_cast<double>(r.step), r.accuracy});
    any_eval = any_eval || !run.evals.empty();
    loss.series.push_back(std::move(ls));
    diff.series.push_back(std::move(ds));
    acc.series.push_back(std::move(as));
    scale.series.push_back(std::move(ss));
    legend.push_back({run.label() + (i == 0 ? " [baseline]" : ""), color, width, opacity});
  }
  if (any_skipped) loss.title += "  (x = skipped step)";
  std::vector<ChartPanel> panels;
  panels.push_back(std::move(loss));
  if (c.runs.size() > 1) panels.push_back(std::move(diff));
  if (any_eval) panels.push_back(std::move(acc));
  panels.push_back(std::move(scale));
  return render_svg_chart(
      "mixtrain compare: " + std::to_string(c.runs.size()) + " runs against " + c.runs.front().name,
      "step", panels, legend);
}

std::vector<fs::path> write_comparison(const RunComparison& c, const fs::path& out_dir) {
  if (fs::exists(out_dir) && !fs::is_directory(out_dir))
    throw sdk::UserError(out_dir.string() + ": exists and is not a folder",
                         "pass --out a folder (it is created when missing)");
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec)
    throw sdk::UserError("cannot create " + out_dir.string() + ": " + ec.message(),
                         "pass --out a folder you can write to");
  const std::string contents[] = {comparison_json(c), comparison_markdown(c), comparison_svg(c)};
  std::vector<fs::path> written;
  for (std::size_t i = 0; i < std::size(kCompareOutputNames); ++i) {
    const auto p = out_dir / kCompareOutputNames[i];
    if (fs::exists(p) && !fs::is_regular_file(p))
      throw sdk::UserError(p.string() + ": exists and is not a file; refusing to replace it",
                           "pass --out another folder");
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << contents[i];
    out.close();
    if (!out)
      throw sdk::UserError("cannot write " + p.string(), "pass --out a folder you can write to");
    written.push_back(p);
  }
  return written;
}

}  // namespace mixtrain::core
