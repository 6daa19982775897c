#include "runs/jsonl_sink.h"

namespace mixtrain::core {

JsonlSink::JsonlSink(const std::filesystem::path& path) : out_(path) {}

void JsonlSink::write(const nlohmann::json& record) {
  out_.append(record.dump() + '\n');
}

}  // namespace mixtrain::core
