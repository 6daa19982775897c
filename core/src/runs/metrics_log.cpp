#include "runs/metrics_log.h"

#include "runs/csv_sink.h"
#include "runs/jsonl_sink.h"
#include "runs/tensorboard_sink.h"

namespace mixtrain::core {

MetricsLog::MetricsLog() = default;
MetricsLog::~MetricsLog() = default;
MetricsLog::MetricsLog(MetricsLog&&) noexcept = default;
MetricsLog& MetricsLog::operator=(MetricsLog&&) noexcept = default;

void MetricsLog::open(const std::filesystem::path& run_dir,
                      const std::vector<MetricsSinkKind>& sinks, std::int64_t first_step) {
  sinks_.clear();
  sinks_.push_back(std::make_unique<JsonlSink>(run_dir / "metrics.jsonl"));
  for (const MetricsSinkKind sink : sinks) {
    switch (sink) {
      case MetricsSinkKind::jsonl:
        break;
      case MetricsSinkKind::tensorboard:
        sinks_.push_back(std::make_unique<TensorBoardSink>(run_dir, first_step));
        break;
      case MetricsSinkKind::csv:
        sinks_.push_back(std::make_unique<CsvSink>(run_dir / "metrics.csv"));
        break;
    }
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
