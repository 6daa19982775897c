// metrics.jsonl as two runs of one computation must agree on it: each record without what
// measures time or the process (samples_per_s, and the device and host memory fields, which a
// resumed run or another process measures differently).
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mixtrain::test {

inline nlohmann::json without_measures(nlohmann::json record) {
  for (const char* key :
       {"samples_per_s", "device_memory_bytes", "device_peak_memory_bytes", "host_peak_rss_bytes"})
    record.erase(key);
  return record;
}

// Every record of the file, in order, without its measures.
inline std::vector<nlohmann::json> unmeasured_records(const std::filesystem::path& metrics_jsonl) {
  std::ifstream in(metrics_jsonl);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);)
    out.push_back(without_measures(nlohmann::json::parse(line)));
  return out;
}

}  // namespace mixtrain::test
