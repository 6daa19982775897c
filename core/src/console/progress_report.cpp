#include "mixtrain/core/console/progress_report.h"

#include <cmath>
#include <cstdio>

#include "mixtrain/core/console/live_line.h"

namespace mixtrain::core {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  return buf;
}

ProgressReport::ProgressReport(std::int64_t first_step, std::int64_t total_steps,
                               std::int64_t batch_size, bool live, sdk::Logger log)
    : first_step_(first_step),
      total_steps_(total_steps),
      batch_size_(batch_size),
      live_(live),
      log_(std::move(log)),
      start_(Clock::now()),
      last_live_(start_ - std::chrono::seconds(1)) {}

double ProgressReport::elapsed_s() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

double ProgressReport::eta_s(std::int64_t step) const {
  const auto done = step - first_step_;
  if (done <= 0) return std::nan("");
  return elapsed_s() / static_cast<double>(done) * static_cast<double>(total_steps_ - step);
}

bool ProgressReport::live_due(std::int64_t step) const {
  return live_ &&
         (Clock::now() - last_live_ > std::chrono::milliseconds(200) || step == total_steps_);
}

void ProgressReport::show_live(std::int64_t step, double loss, double loss_scale) {
  last_live_ = Clock::now();
  const double elapsed = elapsed_s();
  const auto done = step - first_step_;
  const double sps =
      done > 0 && elapsed > 0 ? static_cast<double>(done * batch_size_) / elapsed : 0.0;
  char line[256];
  std::snprintf(
      line, sizeof line, "step %lld/%lld  loss %.4f  scale %g  %.0f samples/s  %s  ETA %s",
      static_cast<long long>(step), static_cast<long long>(total_steps_), loss, loss_scale, sps,
      format_duration(elapsed).c_str(), format_duration(eta_s(step)).c_str());
  LiveLine::instance().show(line);
}

void ProgressReport::log_step(std::int64_t step, double loss, double loss_scale, double lr,
                              double samples_per_s) {
  if (live_) return;
  char line[256];
  std::snprintf(line, sizeof line,
                "step %lld/%lld loss %.5f scale %g lr %.3g %.0f samples/s, %s elapsed, ETA %s",
                static_cast<long long>(step), static_cast<long long>(total_steps_), loss,
                loss_scale, lr, samples_per_s, format_duration(elapsed_s()).c_str(),
                format_duration(eta_s(step)).c_str());
  log_.info(line);
}

void ProgressReport::finish() {
  if (live_) LiveLine::instance().finish();
}

}  // namespace mixtrain::core
