#include "mixtrain/core/console/log_sink.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "distributed/launch.h"
#include "mixtrain/core/console/live_line.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

namespace {

spdlog::level::level_enum to_spdlog(sdk::LogLevel l) {
  switch (l) {
    case sdk::LogLevel::trace:
      return spdlog::level::trace;
    case sdk::LogLevel::debug:
      return spdlog::level::debug;
    case sdk::LogLevel::info:
      return spdlog::level::info;
    case sdk::LogLevel::warn:
      return spdlog::level::warn;
    case sdk::LogLevel::error:
      return spdlog::level::err;
  }
  return spdlog::level::info;
}

thread_local int quiet_depth = 0;  // QuietLogs open on this thread

class SpdlogSink final : public sdk::LogSink {
 public:
  SpdlogSink() : logger_(spdlog::stderr_color_mt("mixtrain")) {
    logger_->set_pattern("%^[%H:%M:%S.%e] [%l]%$ %v");
    logger_->set_level(spdlog::level::info);
  }
  void write(sdk::LogLevel level, std::string_view component, std::string_view message) override {
    if (!enabled(level)) return;
    // A log line takes the screen line of the live progress line, which is redrawn below it.
    LiveLine::instance().around_output(
        [&] { logger_->log(to_spdlog(level), "[{}] {}", component, message); });
  }
  bool enabled(sdk::LogLevel level) const override {
    return quiet_depth == 0 && logger_->should_log(to_spdlog(level));
  }
  spdlog::logger& logger() { return *logger_; }

 private:
  std::shared_ptr<spdlog::logger> logger_;
};

SpdlogSink& sink() {
  static SpdlogSink* s = new SpdlogSink();  // never destroyed: plugins may log until exit
  return *s;
}

}  // namespace

QuietLogs::QuietLogs() noexcept {
  ++quiet_depth;
}
QuietLogs::~QuietLogs() {
  --quiet_depth;
}

sdk::LogSink& host_log_sink() {
  return sink();
}

void set_log_level(const std::string& level) {
  auto l = spdlog::level::from_str(level);
  if (l == spdlog::level::off && level != "off")
    throw sdk::UserError("unknown log level '" + level + "'",
                         "use one of: trace, debug, info, warn, error, off");
  sink().logger().set_level(l);
}

namespace {
std::string& rank_prefix_text() {
  static std::string prefix;
  return prefix;
}
}  // namespace

void set_log_rank(int rank) {
  if (rank == 0) return;
  rank_prefix_text() = "rank " + std::to_string(rank) + ": ";
  sink().logger().set_pattern("%^[%H:%M:%S.%e] [%l]%$ rank " + std::to_string(rank) + " %v");
  if (sink().logger().level() < spdlog::level::warn) sink().logger().set_level(spdlog::level::warn);
}

void set_log_rank_from_launcher() {
  if (const MpiLaunch launch = detect_mpi_launch(); launch.detected) set_log_rank(launch.rank);
}

const std::string& rank_prefix() {
  return rank_prefix_text();
}

sdk::Logger core_logger(const std::string& component) {
  return sdk::Logger(&sink(), component);
}

}  // namespace mixtrain::core
