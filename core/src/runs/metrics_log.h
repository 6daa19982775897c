// MetricsLog: where a run's metric records go. It owns the sinks run.metrics chooses
// (runs/metrics_sink.h): metrics.jsonl always, TensorBoard event files and metrics.csv on request,
// all in the run folder, and hands each record to every sink in turn. Closed (never opened) it
// drops records: runs without outputs (tests, `mixtrain check`) write nothing. Internal to the
// core.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/config/setting_choices.h"
#include "runs/metrics_sink.h"

namespace mixtrain::core {

class MetricsLog {
 public:
  MetricsLog();
  ~MetricsLog();
  MetricsLog(MetricsLog&&) noexcept;
  MetricsLog& operator=(MetricsLog&&) noexcept;

  // Opens the sinks in `sinks` (run.metrics; metrics.jsonl whether listed or not) in `run_dir`.
  // `first_step`: the step a resumed run continues from (0 for a fresh run). Throws sdk::UserError
  // when a file cannot be written, having removed the metric files this call created (a folder
  // that holds a metrics.jsonl holds a run: the same command could not start again).
  void open(const std::filesystem::path& run_dir, const std::vector<MetricsSinkKind>& sinks,
            std::int64_t first_step);
  // Each record write() takes, after the sinks, whether or not any sink is open (an embedding
  // program's view of the run: TrainOptions::on_record).
  void observe(std::function<void(const nlohmann::json&)> observer);
  void write(const nlohmann::json& record);
  void write_text(std::int64_t step, const std::string& tag, const std::string& markdown);
  bool keeps_text() const;  // whether any sink has a place for write_text()'s text

 private:
  std::vector<std::unique_ptr<MetricsSink>> sinks_;
  std::function<void(const nlohmann::json&)> observer_;
};

}  // namespace mixtrain::core
