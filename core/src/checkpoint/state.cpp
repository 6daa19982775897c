#include "checkpoint/state.h"

#include <cfloat>
#include <cmath>
#include <limits>
#include <type_traits>
#include <variant>

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr auto kInt64Max = std::numeric_limits<std::int64_t>::max();
const char* kDamaged = "the checkpoint is damaged; use an earlier one";

[[noreturn]] void fail(const fs::path& file, const std::string& what,
                       const std::string& hint = kDamaged) {
  throw sdk::CheckpointError(file.string() + ": " + what, hint);
}

std::string range_text(std::int64_t min, std::int64_t max) {
  return "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
}

// nlohmann's get<int64_t>() casts whatever number it holds: 2^64-1 becomes -1 and 1e300 is
// undefined behaviour, so the JSON type is checked first.
std::int64_t strict_int(const json& j, const std::string& field, const fs::path& file) {
  if (j.is_number_integer()) {
    if (j.is_number_unsigned() && j.get<std::uint64_t>() > static_cast<std::uint64_t>(kInt64Max))
      fail(file, field + " = " + j.dump() + " does not fit in a signed 64-bit integer");
    return j.get<std::int64_t>();
  }
  fail(file, field + " = " + j.dump() + " is not an integer");
}

// JSON has no NaN or infinity: they are written as the strings "nan", "inf" and "-inf" (an amax
// history may hold any of them, and the FP8 scale rules treat each differently, so a resume must
// get back the same one). Checkpoints from before wrote null for all three; null reads as NaN.
double strict_double(const json& j, const std::string& field, const fs::path& file) {
  if (j.is_null()) return std::nan("");
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  if (!j.is_number()) fail(file, field + " = " + j.dump() + " is not a number");
  return j.get<double>();
}

// A float value: a double outside the float range would overflow the conversion.
float strict_float(const json& j, const std::string& field, const fs::path& file) {
  const double d = strict_double(j, field, file);
  if (std::isfinite(d) && std::fabs(d) > static_cast<double>(FLT_MAX))
    fail(file, field + " = " + j.dump() + " is outside the float range");
  return static_cast<float>(d);
}

const json& member(const json& j, const char* key, const std::string& where, const fs::path& file) {
  if (!j.is_object()) fail(file, "the " + where + " entry is not a JSON object");
  auto it = j.find(key);
  if (it == j.end()) fail(file, "the " + where + " entry has no '" + key + "'");
  return *it;
}

json double_to_json(double d) {
  if (std::isfinite(d)) return json(d);
  if (std::isnan(d)) return json("nan");
  return json(d > 0 ? "inf" : "-inf");
}

}  // namespace

std::int64_t read_checkpoint_int(const json& j, const std::string& field, std::int64_t min,
                                 std::int64_t max, const fs::path& file) {
  const auto v = strict_int(j, field, file);
  if (v < min || v > max)
    fail(file, field + " = " + std::to_string(v) + " is outside " + range_text(min, max));
  return v;
}

json component_state_to_json(const std::string& component, const sdk::ComponentState& st) {
  json values = json::object();
  for (const auto& [key, v] : st.values) {
    const std::string& k = key;  // clang 14 cannot capture a structured binding
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, bool>)
            values[k] = {{"bool", x}};
          else if constexpr (std::is_same_v<T, std::int64_t>)
            values[k] = {{"int", x}};
          else if constexpr (std::is_same_v<T, double>)
            values[k] = {{"double", double_to_json(x)}};
          else if constexpr (std::is_same_v<T, std::string>)
            values[k] = {{"string", x}};
          else {
            json floats = json::array();
            for (float f : x) floats.push_back(double_to_json(static_cast<double>(f)));
            values[k] = {{"floats", floats}};
          }
        },
        v);
  }
  return {{"component", component}, {"version", st.version}, {"values", values}};
}

sdk::ComponentState component_state_from_json(const json& j, const std::string& what,
                                              const std::string& expected_component,
                                              const fs::path& file) {
  const std::string where = what + " state";
  const auto& component = member(j, "component", where, file);
  if (!component.is_string()) fail(file, where + " 'component' is not a string");
  if (component.get<std::string>() != expected_component)
    fail(file,
         "the " + what + " state was written by '" + component.get<std::string>() +
             "' but this run uses '" + expected_component + "'",
         "resume with the same " + what + " as the original run (see its config.toml)");
  sdk::ComponentState st;
  st.version = strict_int(member(j, "version", where, file), where + " version", file);
  const auto& values = member(j, "values", where, file);
  if (!values.is_object()) fail(file, where + " 'values' is not a JSON object");
  for (const auto& [k, v] : values.items()) {
    const std::string field = where + " entry '" + k + "'";
    if (!v.is_object() || v.size() != 1) fail(file, "malformed " + field);
    const auto entry = v.begin();
    const std::string type = entry.key();
    const json& x = entry.value();
    if (type == "bool" && x.is_boolean())
      st.values[k] = x.get<bool>();
    else if (type == "int")
      st.values[k] = strict_int(x, field, file);
    else if (type == "double")
      st.values[k] = strict_double(x, field, file);
    else if (type == "string" && x.is_string())
      st.values[k] = x.get<std::string>();
    else if (type == "floats" && x.is_array()) {
      std::vector<float> floats;
      floats.reserve(x.size());
      for (const auto& f : x) floats.push_back(strict_float(f, field, file));
      st.values[k] = std::move(floats);
    } else
      fail(file, "malformed " + field + ": " + v.dump());
  }
  return st;
}

void check_training_state_version(const std::map<std::string, std::string>& metadata,
                                  const fs::path& file) {
  auto it = metadata.find("mixtrain.state_version");
  if (it == metadata.end())
    fail(file, "no 'mixtrain.state_version' entry",
         "this file holds weights only; use it as checkpoint.init_from");
  if (metadata.count("mixtrain.weights_only"))
    fail(file, "its format kept the weights only (metadata 'mixtrain.weights_only')",
         "it cannot be resumed: start a new run from these weights, --set "
         "checkpoint.init_from=" +
             file.string() +
             " without --resume (the step count, the optimizer state and the data order start "
             "afresh); a run resumes from checkpoints of a format that keeps the training state "
             "(checkpoint.format = \"native\")");
  if (it->second != kTrainingStateVersion)
    fail(file,
         "mixtrain.state_version is '" + it->second + "', this build reads only '" +
             kTrainingStateVersion + "'",
         "resume with the mixtrain version that wrote the checkpoint");
}

json progress_to_json(const TrainingProgress& p) {
  return {{"step", p.step},
          {"applied_steps", p.applied},
          {"skipped_steps", p.skipped},
          {"last_loss", double_to_json(static_cast<double>(p.last_loss))}};
}

TrainingProgress read_progress(const json& j, std::int64_t run_steps, const fs::path& file) {
  TrainingProgress p;
  p.step = strict_int(member(j, "step", "progress", file), "progress.step", file);
  if (p.step < 0) fail(file, "progress.step = " + std::to_string(p.step) + " is negative");
  if (p.step > run_steps)
    fail(file,
         "progress.step = " + std::to_string(p.step) + " is beyond run.steps = " +
             std::to_string(run_steps) + ": the checkpoint belongs to a longer run",
         "to train on from it, raise run.steps above " + std::to_string(p.step) +
             " (e.g. --set run.steps=" + std::to_string(p.step + (p.step < kInt64Max)) + ")");
  p.applied = read_checkpoint_int(member(j, "applied_steps", "progress", file),
                                  "progress.applied_steps", 0, p.step, file);
  // Every step is applied or skipped, so the two counts sum to the step.
  p.skipped =
      strict_int(member(j, "skipped_steps", "progress", file), "progress.skipped_steps", file);
  if (p.skipped != p.step - p.applied)
    fail(file, "progress.skipped_steps = " + std::to_string(p.skipped) +
                   " but every step is applied or skipped: it must be progress.step - "
                   "progress.applied_steps = " +
                   std::to_string(p.step - p.applied));
  p.last_loss = strict_float(member(j, "last_loss", "progress", file), "progress.last_loss", file);
  return p;
}

void check_component_counters(const sdk::ComponentState& state, const std::string& what,
                              const TrainingProgress& progress, const fs::path& file) {
  struct Counter {
    const char* entry;
    std::int64_t expected;
    const char* progress_field;
    const char* why;
  };
  std::vector<Counter> counters;
  if (what == "scaler") {
    counters = {{"steps", progress.step, "progress.step", "the scaler is updated once per step"},
                {"skipped_steps", progress.skipped, "progress.skipped_steps",
                 "the scaler decides every skip"}};
  } else if (what == "optimizer") {
    counters = {{"step", progress.applied, "progress.applied_steps",
                 "the optimizer steps once per applied step"}};
  } else if (what == "policy") {
    counters = {{"applied_steps", progress.applied, "progress.applied_steps",
                 "the policy hears of every applied step"}};
  }
  for (const auto& c : counters) {
    auto it = state.values.find(c.entry);
    if (it == state.values.end()) continue;
    const auto* value = std::get_if<std::int64_t>(&it->second);
    if (value == nullptr || *value == c.expected)
      continue;  // a mistype is the component's to report
    fail(file, what + " state entry '" + c.entry + "' = " + std::to_string(*value) + " but " +
                   c.progress_field + " = " + std::to_string(c.expected) + " (" + c.why + ")");
  }
}

json watched_metric_to_json(const WatchedMetric& w) {
  return {
      {"metric", w.metric},       {"has_best", w.has_best},   {"best", double_to_json(w.best)},
      {"best_step", w.best_step}, {"bad_evals", w.bad_evals}, {"last_eval_step", w.last_eval_step}};
}

WatchedMetric read_watched_metric(const json& j, const std::string& field, std::int64_t step,
                                  const fs::path& file) {
  WatchedMetric w;
  const auto& metric = member(j, "metric", field, file);
  if (!metric.is_string()) fail(file, field + ".metric = " + metric.dump() + " is not a string");
  w.metric = metric.get<std::string>();
  const auto& has_best = member(j, "has_best", field, file);
  if (!has_best.is_boolean())
    fail(file, field + ".has_best = " + has_best.dump() + " is not a boolean");
  w.has_best = has_best.get<bool>();
  w.best = strict_double(member(j, "best", field, file), field + ".best", file);
  if (w.has_best && std::isnan(w.best))
    fail(file, field + ".best is NaN, but a NaN evaluation never becomes the best");
  w.last_eval_step = read_checkpoint_int(member(j, "last_eval_step", field, file),
                                         field + ".last_eval_step", 0, step, file);
  w.best_step = read_checkpoint_int(member(j, "best_step", field, file), field + ".best_step", 0,
                                    w.last_eval_step, file);
  w.bad_evals =
      read_checkpoint_int(member(j, "bad_evals", field, file), field + ".bad_evals", 0, step, file);
  return w;
}

BatchSampler::Cursor read_sampler_cursor(const json& j, std::int64_t step,
                                         std::int64_t batches_per_epoch, const fs::path& file) {
  BatchSampler::Cursor c;
  c.epoch =
      read_checkpoint_int(member(j, "epoch", "sampler", file), "sampler.epoch", 0, step, file);
  c.position = read_checkpoint_int(member(j, "position", "sampler", file), "sampler.position", 0,
                                   batches_per_epoch, file);
  // Every step draws one batch, so the cursor follows from the step: a cursor that does not
  // would replay or skip data without a word.
  BatchSampler::Cursor expected;
  if (step > 0 && batches_per_epoch > 0) {
    expected.epoch = (step - 1) / batches_per_epoch;
    expected.position = (step - 1) % batches_per_epoch + 1;
  }
  if (c.epoch != expected.epoch || c.position != expected.position)
    throw sdk::CheckpointError(
        file.string() + ": sampler.epoch/sampler.position = " + std::to_string(c.epoch) + "/" +
            std::to_string(c.position) +
            " do not follow from progress.step = " + std::to_string(step) + " at " +
            std::to_string(batches_per_epoch) + " batches per epoch (expected " +
            std::to_string(expected.epoch) + "/" + std::to_string(expected.position) + ")",
        "resume with the original run's data.batch_size and run.accumulate; otherwise the "
        "checkpoint is damaged: resume from another one");
  return c;
}

}  // namespace mixtrain::core
