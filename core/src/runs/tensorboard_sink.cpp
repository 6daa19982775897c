#include "runs/tensorboard_sink.h"

#include <limits>

namespace mixtrain::core {

using json = nlohmann::json;

namespace {

// A step record's keys and their tags. next_loss_scale has none (it is the next record's
// loss_scale), nor has nonfinite (a tensor's name).
const std::vector<std::pair<std::string, std::string>>& step_tags() {
  static const std::vector<std::pair<std::string, std::string>> tags = {
      {"loss", "train/loss"},
      {"loss_scale", "train/loss_scale"},
      {"lr", "train/lr"},
      {"grad_norm", "train/grad_norm"},
      {"samples_per_s", "train/samples_per_s"},
      {"skipped", "train/skipped"},
      {"epoch", "train/epoch"},
      {"device_memory_bytes", "memory/device_bytes"},
      {"device_peak_memory_bytes", "memory/device_peak_bytes"},
      {"host_peak_rss_bytes", "memory/host_peak_rss_bytes"}};
  return tags;
}

// metrics.jsonl writes a non-finite number as null; as a scalar it is NaN (TensorBoard shows it).
void add(std::vector<std::pair<std::string, float>>& out, std::string tag, const json& v) {
  if (v.is_boolean())
    out.emplace_back(std::move(tag), v.get<bool>() ? 1.0f : 0.0f);
  else if (v.is_number())
    out.emplace_back(std::move(tag), static_cast<float>(v.get<double>()));
  else if (v.is_null())
    out.emplace_back(std::move(tag), std::numeric_limits<float>::quiet_NaN());
}

}  // namespace

std::vector<std::pair<std::string, float>> tensorboard_scalars(const json& record) {
  std::vector<std::pair<std::string, float>> out;
  if (!record.is_object()) return out;
  if (record.contains("loss"))
    for (const auto& [key, tag] : step_tags())
      if (auto it = record.find(key); it != record.end()) {
        // No gradient norm (an unlogged step, a skipped one) is no point rather than NaN.
        if (key == "grad_norm" && it->is_null()) continue;
        add(out, tag, *it);
      }
  for (const auto& [key, value] : record.items())
    if (key.rfind("eval_", 0) == 0) add(out, "eval/" + key.substr(5), value);
  // A skipped step's underflow and FP8 records measured its overflowed pass: not plotted, as
  // `compare` leaves them out (train/run_metrics.h).
  if (measured_on_skipped_step(record)) return out;
  if (auto it = record.find("underflow"); it != record.end() && it->is_object()) {
    if (auto scale = record.find("underflow_scale"); scale != record.end())
      add(out, "underflow/loss_scale", *scale);
    for (const auto& [tensor, stats] : it->items())
      if (stats.is_object() && stats.contains("flushed_share"))
        add(out, "underflow/" + tensor, stats["flushed_share"]);
  }
  // An escalation record (precision/escalation.h): how many promotions stand after it.
  if (auto it = record.find("escalations_standing"); it != record.end())
    add(out, "precision/escalations_standing", *it);
  if (auto it = record.find("fp8"); it != record.end() && it->is_object())
    for (const auto& [slot, stats] : it->items())
      if (stats.is_object())
        for (const char* field : {"amax", "scale", "saturated_share", "underflow_share"})
          if (auto f = stats.find(field); f != stats.end())
            add(out, "fp8/" + slot + "/" + field, *f);
  return out;
}

TensorBoardSink::TensorBoardSink(const std::filesystem::path& run_dir, std::int64_t first_step)
    : writer_(run_dir) {
  if (first_step > 0) writer_.add_session_start(first_step + 1);
}

void TensorBoardSink::write(const json& record) {
  if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer())
    return;
  writer_.add_scalars(record["step"].get<std::int64_t>(), tensorboard_scalars(record));
}

void TensorBoardSink::write_text(std::int64_t step, const std::string& tag,
                                 const std::string& markdown) {
  writer_.add_text(step, tag, markdown);
}

}  // namespace mixtrain::core
