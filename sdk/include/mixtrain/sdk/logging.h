// Logging from plugins through the host.
//
// Contract: a plugin never creates its own spdlog registry or writes to stdout/stderr; it logs
// through the `Logger` it receives in its `PluginContext`. The host owns the sink and decides
// level and formatting. A Logger is cheap to copy; it holds a non-owning pointer to the sink,
// which outlives every plugin object.
#pragma once

#include "mixtrain/sdk/export.h"

#include <string>
#include <string_view>

namespace mixtrain::sdk {

enum class LogLevel { trace, debug, info, warn, error };

class MIXTRAIN_SDK_API LogSink {
 public:
  virtual ~LogSink();
  virtual void write(LogLevel level, std::string_view component, std::string_view message) = 0;
  virtual bool enabled(LogLevel level) const = 0;
};

class Logger {
 public:
  Logger() = default;
  Logger(LogSink* sink, std::string component) : sink_(sink), component_(std::move(component)) {}

  bool enabled(LogLevel l) const { return sink_ != nullptr && sink_->enabled(l); }
  void log(LogLevel l, std::string_view msg) const {
    if (enabled(l)) sink_->write(l, component_, msg);
  }
  void debug(std::string_view m) const { log(LogLevel::debug, m); }
  void info(std::string_view m) const { log(LogLevel::info, m); }
  void warn(std::string_view m) const { log(LogLevel::warn, m); }
  void error(std::string_view m) const { log(LogLevel::error, m); }
  const std::string& component() const { return component_; }

 private:
  LogSink* sink_ = nullptr;
  std::string component_;
};

}  // namespace mixtrain::sdk
