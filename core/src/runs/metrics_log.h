// MetricsLog: the run folder's metrics.jsonl, one JSON object per line, flushed as written so a
// killed run keeps every record before the kill. Closed (never opened) it drops records: runs
// without outputs (tests, `mixtrain check`) write nothing. Internal to the core.
#pragma once

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace mixtrain::core {

class MetricsLog {
 public:
  // Appends to `path` (a resumed run continues its file); throws sdk::UserError when unwritable.
  void open(const std::filesystem::path& path);
  void write(const nlohmann::json& record);

 private:
  std::ofstream out_;
};

}  // namespace mixtrain::core
