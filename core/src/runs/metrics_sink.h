// MetricsSink: one destination of a run's metric records (metrics.jsonl, TensorBoard event files,
// metrics.csv). MetricsLog (runs/metrics_log.h) owns the sinks a config chooses and hands each the
// same records, in the order the trainer writes them.
//
// Contract
// - A record is a JSON object with an integer "step" and the numbers of one kind of record: a
//   training step (loss, lr, ...), an evaluation (eval_*), per-tensor gradient underflow or FP8
//   operand statistics. A sink keeps what it has a place for and ignores the rest. The underflow
//   and FP8 records of a skipped step carry "skipped": true (they measured its overflowed pass);
//   measured_on_skipped_step() tells them apart, for readers that leave them out.
// - Each write reaches the file before it returns (flushed), so a killed run keeps every record
//   written before the kill. Opening throws sdk::UserError for an unwritable file; a write that
//   fails later (a full disk) drops that record whole, warns, and does not stop training; later
//   records land once there is space (runs/record_appender.h).
// - write_text() gives text for people (the run's config and precision plan, as markdown); sinks
//   without a place for text ignore it, and say so with keeps_text(), so that nobody renders text
//   for none.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace mixtrain::core {

// A diagnostic record (no loss: not the step's own record) of a step that was skipped.
inline bool measured_on_skipped_step(const nlohmann::json& record) {
  const auto skipped = record.find("skipped");
  return !record.contains("loss") && skipped != record.end() && skipped->is_boolean() &&
         skipped->get<bool>();
}

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  virtual void write(const nlohmann::json& record) = 0;
  virtual void write_text(std::int64_t /*step*/, const std::string& /*tag*/,
                          const std::string& /*markdown*/) {}
  virtual bool keeps_text() const { return false; }
};

}  // namespace mixtrain::core
