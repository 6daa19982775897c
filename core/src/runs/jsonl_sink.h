// JsonlSink: metrics.jsonl, one JSON object per line, appended (a resumed run continues its file).
// Every run writes it: `mixtrain compare` and resuming read it. Internal to the core.
#pragma once

#include <filesystem>

#include "runs/metrics_sink.h"
#include "runs/record_appender.h"

namespace mixtrain::core {

class JsonlSink final : public MetricsSink {
 public:
  explicit JsonlSink(const std::filesystem::path& path);  // sdk::UserError when unwritable
  void write(const nlohmann::json& record) override;

 private:
  RecordAppender out_;
};

}  // namespace mixtrain::core
