// The host's log sink: spdlog behind sdk::LogSink, shared by the core and every plugin.
//
// Contract: one process-wide logger writing to stderr ("[time] [level] [component] message",
// "[time] [level] rank N [component] message" on a data-parallel rank other than 0);
// set_log_level() accepts trace|debug|info|warn|error|off and raises sdk::UserError otherwise.
// A log line never shares a screen line with the live progress line (see console/live_line.h).
#pragma once

#include <string>

#include "mixtrain/sdk/logging.h"

namespace mixtrain::core {

sdk::LogSink& host_log_sink();
void set_log_level(const std::string& level);
sdk::Logger core_logger(const std::string& component);
// A data-parallel rank other than 0 logs warnings and errors only, each line prefixed with
// "rank N"; rank_prefix() is that prefix ("rank N: ", or "" for rank 0 and one process), which
// the CLI puts before its final error line too.
void set_log_rank(int rank);
// set_log_rank() with the rank an MPI launcher gave this process (its environment), for the lines
// a training process logs before its communicator exists (config, plugins); nothing without one.
void set_log_rank_from_launcher();
const std::string& rank_prefix();

// While one lives on a thread, the host sink writes nothing that thread logs: a probe that calls
// a component only to read its answer (the trainer asking a loss scaler what more overflows would
// do) leaves no line about things that never happened. Nests.
class QuietLogs {
 public:
  QuietLogs() noexcept;
  ~QuietLogs();
  QuietLogs(const QuietLogs&) = delete;
  QuietLogs& operator=(const QuietLogs&) = delete;
};

}  // namespace mixtrain::core
