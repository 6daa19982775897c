// Progress of a training run for the person watching it.
//
// Contract
// - live (a terminal on stderr): a live line (step, loss, loss scale, samples/s, elapsed, ETA)
//   redrawn in place through LiveLine; log lines print above it, never onto it. The per-step log
//   lines are left out: the live line and metrics.jsonl hold them.
// - piped: one log line per logged step, with the elapsed time and the ETA, never a '\r'.
// - Times count from construction; the ETA extrapolates the mean step time of this invocation
//   (a resumed run counts from its first step here).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "mixtrain/sdk/logging.h"

namespace mixtrain::core {

class ProgressReport {
 public:
  ProgressReport(std::int64_t first_step, std::int64_t total_steps, std::int64_t batch_size,
                 bool live, sdk::Logger log);

  bool live() const { return live_; }
  // Whether the live line wants a redraw after `step`: at most five times a second, and always at
  // the last step.
  bool live_due(std::int64_t step) const;
  void show_live(std::int64_t step, double loss, double loss_scale);
  // The line of a logged step; piped output only.
  void log_step(std::int64_t step, double loss, double loss_scale, double lr, double samples_per_s);
  // Ends the live line (it stays on screen); further log lines start on a line of their own.
  void finish();

 private:
  using Clock = std::chrono::steady_clock;
  double elapsed_s() const;
  double eta_s(std::int64_t step) const;

  std::int64_t first_step_, total_steps_, batch_size_;
  bool live_;
  sdk::Logger log_;
  Clock::time_point start_, last_live_;
};

// "1m05s", "2h03m"; "?" for a negative or non-finite duration.
std::string format_duration(double seconds);

}  // namespace mixtrain::core
