// load_run(): reading one run folder (metrics.jsonl, summary.json, config.toml) into a RunData,
// and RunData's own accessors.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>

#include <toml++/toml.h>
#include <nlohmann/json.hpp>

#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/runs/comparison.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/options.h"
#include "runs/component_history_json.h"
#include "runs/metrics_sink.h"

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
    } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
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
    // A skipped step's diagnostics measured its overflowed pass (amaxes NaN): left out.
    if (measured_on_skipped_step(j)) continue;
    if (auto it = j.find("fp8"); it != j.end() && it->is_object())
      for (const auto& [slot, v] : it->items()) {
        if (!v.is_object()) continue;
        // Read as the losses are: null (a non-finite number) is NaN, which a maximum and the
        // last scale pass over; another type is damage, named at its line.
        auto& d = run.fp8_slots[slot];
        if (auto t = v.find("dtype"); t != v.end() && t->is_string())
          d.dtype = t->get<std::string>();
        const std::string at = where + " fp8 '" + slot + "'";
        d.max_saturated_share =
            std::max(d.max_saturated_share, number_or_nan(v, "saturated_share", at, 0.0));
        d.max_underflow_share =
            std::max(d.max_underflow_share, number_or_nan(v, "underflow_share", at, 0.0));
        if (const double scale = number_or_nan(v, "scale", at, kNaN); !std::isnan(scale))
          d.last_scale = scale;
      }
    if (auto it = j.find("underflow"); it != j.end() && it->is_object())
      for (const auto& [tensor, v] : it->items())
        if (v.is_object()) {
          auto& worst = run.max_gradient_underflow[tensor];
          worst = std::max(
              worst, number_or_nan(v, "flushed_share", where + " underflow '" + tensor + "'", 0.0));
        }
    if (auto it = j.find("escalation"); it != j.end() && it->is_object()) {
      RunData::Escalation e;
      e.step = required_step(j, where);
      for (auto [key, out] : {std::pair{"kind", &e.kind}, std::pair{"node", &e.node},
                              std::pair{"from", &e.from}, std::pair{"to", &e.to}}) {
        const auto f = it->find(key);
        if (f == it->end() || !f->is_string())
          throw sdk::DataError(where + ": the escalation record has no '" + key + "' string",
                               "fix or delete that line of metrics.jsonl");
        *out = f->get<std::string>();
      }
      run.escalations.push_back(std::move(e));
    }
    // Other records are from a newer writer; skipping them keeps old readers useful.
  }
}

void read_summary(RunData& run, const fs::path& file) {
  json j;
  try {
    j = json::parse(read_text(file));
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
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
  if (auto h = j.find("segments"); h != j.end())
    if (auto segments = component_history_from_json(*h)) run.segments = std::move(*segments);
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
    node.visit([&](const auto& v) {
      // A float as the config spells it (0.1), not toml++'s 17 digits (0.10000000000000001):
      // the resolved config's own spelling, the shortest that reads back as the same double.
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(v)>, toml::value<double>>) {
        os << sdk::option_value_to_string(sdk::OptionValue{v.get()});
      } else {
        os << v;
      }
    });
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
    // How batches are prepared and evaluated, not what they hold: the same rows either way.
    // The token ids only name ends of text for an export's generate(): the same model either way.
    for (const char* key : {"data.prefetch", "data.pin_memory", "data.eval_batch_size",
                            "model.gpt.bos_token_id", "model.gpt.eos_token_id"})
      setup.erase(key);
    run.setup = std::move(setup);
  } catch (const toml::parse_error&) {
  }
}

void derive_from_records(RunData& run) {
  if (run.has_summary) {
    // A resumed session that ended before its own first evaluation writes a summary without
    // one; the run's last evaluation is then the one metrics.jsonl holds from before the resume.
    if (!run.eval_loss && !run.eval_accuracy && !run.evals.empty()) {
      run.eval_loss = run.evals.back().loss;
      run.eval_accuracy = run.evals.back().accuracy;
    }
    return;
  }
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

}  // namespace

std::string RunData::policy_label() const {
  if (segments.size() > 1) return history_text(segments, HistoryPart::policy);
  if (resolved_policy.empty() || resolved_policy == policy) return policy;
  return policy + "\u2192" + resolved_policy;
}

std::string RunData::scaler_label() const {
  return segments.size() > 1 ? history_text(segments, HistoryPart::scaler) : scaler;
}

std::vector<std::string> RunData::emulated_gemm_inputs() const {
  std::vector<std::string> out;
  for (const auto& [dtype, g] : gemm_inputs)
    if (!g.native) out.push_back(dtype);
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

}  // namespace mixtrain::core
