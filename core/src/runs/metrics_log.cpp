#include "runs/metrics_log.h"

#include <stdexcept>

#include "runs/csv_sink.h"
#include "runs/jsonl_sink.h"
#include "runs/tensorboard_sink.h"

namespace mixtrain::core {

MetricsLog::MetricsLog() = default;
MetricsLog::~MetricsLog() = default;
MetricsLog::MetricsLog(MetricsLog&&) noexcept = default;
MetricsLog& MetricsLog::operator=(MetricsLog&&) noexcept = default;

void MetricsLog::open(const std::filesystem::path& run_dir, const std::vector<std::string>& sinks,
                      std::int64_t first_step) {
  sinks_.clear();
  sinks_.push_back(std::make_unique<JsonlSink>(run_dir / "metrics.jsonl"));
  for (const auto& name : sinks) {
    if (name == "jsonl") continue;
    if (name == "tensorboard")
      sinks_.push_back(std::make_unique<TensorBoardSink>(run_dir, first_step));
    else if (name == "csv")
      sinks_.push_back(std::make_unique<CsvSink>(run_dir / "metrics.csv"));
    else  // the config's schema admits only the names above
      throw std::logic_error("unknown metrics sink '" + name + "'");
  }
}

void MetricsLog::write(const nlohmann::json& record) {
  for (auto& s : sinks_) s->write(record);
}

void MetricsLog::write_text(std::int64_t step, const std::string& tag,
                            const std::string& markdown) {
  for (auto& s : sinks_) s->write_text(step, tag, markdown);
}

bool MetricsLog::keeps_text() const {
  for (const auto& s : sinks_)
    if (s->keeps_text()) return true;
  return false;
}

}  // namespace mixtrain::core
