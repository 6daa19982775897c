#include "runs/metrics_log.h"

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

void MetricsLog::open(const std::filesystem::path& path) {
  out_.open(path, std::ios::app);
  if (!out_) throw sdk::UserError("cannot write " + path.string(), "choose a writable --run-dir");
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << '\n';
  out_.flush();
}

}  // namespace mixtrain::core
