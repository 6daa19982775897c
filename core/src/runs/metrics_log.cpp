#include "runs/metrics_log.h"

#include <set>

#include "runs/csv_sink.h"
#include "runs/jsonl_sink.h"
#include "runs/tensorboard_sink.h"

namespace mixtrain::core {

MetricsLog::MetricsLog() = default;
MetricsLog::~MetricsLog() = default;
MetricsLog::MetricsLog(MetricsLog&&) noexcept = default;
MetricsLog& MetricsLog::operator=(MetricsLog&&) noexcept = default;

namespace {

// The metric files of a run folder: what open() may create.
bool is_metrics_file(const std::string& name) {
  return name == "metrics.jsonl" || name == "metrics.csv" ||
         name.starts_with("events.out.tfevents.");
}

std::set<std::filesystem::path> metrics_files(const std::filesystem::path& dir) {
  std::set<std::filesystem::path> files;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (is_metrics_file(it->path().filename().string())) files.insert(it->path());
  return files;
}

}  // namespace

void MetricsLog::open(const std::filesystem::path& run_dir,
                      const std::vector<MetricsSinkKind>& sinks, std::int64_t first_step) {
  sinks_.clear();
  const auto before = metrics_files(run_dir);
  try {
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
  } catch (...) {
    // A metrics.jsonl this open created would mark the folder as holding a run (runs/folder.h),
    // and the same command, run again once the cause is fixed, would be refused.
    sinks_.clear();
    std::error_code ec;
    for (const auto& file : metrics_files(run_dir))
      if (!before.contains(file)) std::filesystem::remove(file, ec);
    throw;
  }
}

void MetricsLog::observe(std::function<void(const nlohmann::json&)> observer) {
  observer_ = std::move(observer);
}

void MetricsLog::write(const nlohmann::json& record) {
  for (auto& s : sinks_) s->write(record);
  if (observer_) observer_(record);
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
