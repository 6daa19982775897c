#include "runs/jsonl_sink.h"

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

JsonlSink::JsonlSink(const std::filesystem::path& path) : out_(path, std::ios::app) {
  if (!out_) throw sdk::UserError("cannot write " + path.string(), "choose a writable --run-dir");
}

void JsonlSink::write(const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
}

}  // namespace mixtrain::core
