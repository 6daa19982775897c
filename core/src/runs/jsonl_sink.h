// JsonlSink: metrics.jsonl, one JSON object per line, appended (a resumed run continues its file).
// Every run writes it: `mixtrain compare` and resuming read it. Internal to the core.
#pragma once

#include <filesystem>
#include <fstream>

#include "runs/metrics_sink.h"

namespace mixtrain::core {

class JsonlSink final : public MetricsSink {
 public:
  explicit JsonlSink(const std::filesystem::path& path);  // sdk::UserError when unwritable
  void write(const nlohmann::json& record) override;

 private:
  std::ofstream out_;
};

}  // namespace mixtrain::core
