// AdaptiveLossScaler ("adaptive"): a dynamic loss scale whose growth interval adapts to how often
// the gradients overflow, instead of a fixed growth_interval.
//
// Why: a fixed interval is either too eager (a model that overflows every few hundred steps keeps
// growing into the same overflow and skipping a step each time) or too timid (a model that never
// overflows waits thousands of steps to recover scale after one spike). Here the interval learns.
//
// Contract (one standing update() per step, found_inf = any non-finite unscaled gradient; the
// host may take a tentative update(false) back with load_state(), sdk/loss_scaler.h, so its log
// lines of a finite step are written when the next update() confirms it, or at destruction):
// - found_inf: the step is skipped and the scale backs off at once (no hysteresis) to
//   max(scale * backoff_factor, FLT_MIN). If the overflow came before the scale had stayed at its
//   last grown value for `interval` steps, the growth was premature: interval doubles (<= max).
//   The clean streak resets.
// - finite: the step is applied and the streak increments; when it reaches `interval` the scale
//   grows to scale * growth_factor (kept when that would not be a finite float). If by then no
//   overflow has happened for 4 * interval steps, growing is evidently safe: interval halves
//   (>= min_interval).
// - interval starts at min_interval: optimistic at first, the first premature overflow corrects it.
// State (version 1): scale, interval, streak, steps since the last growth and since the last
// overflow, whether the scale grew since the last overflow, step and skip counts. Loading a state
// saved under other interval bounds clamps the interval into the new ones.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/sdk/loss_scaler.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/plugin.h"

namespace mixtrain_samples {

class AdaptiveLossScaler final : public mixtrain::sdk::LossScaler {
 public:
  static constexpr std::int64_t kStateVersion = 1;
  static mixtrain::sdk::OptionSchema option_schema();

  AdaptiveLossScaler(const mixtrain::sdk::Options& options,
                     const mixtrain::sdk::PluginContext& context);

  ~AdaptiveLossScaler() override;

  float scale() const override { return scale_; }
  mixtrain::sdk::ScalerDecision update(bool found_inf) override;
  mixtrain::sdk::ComponentState save_state() const override;
  void load_state(const mixtrain::sdk::ComponentState& state) override;

  std::int64_t interval() const { return interval_; }

 private:
  void on_overflow();
  void on_finite();
  // The log line of the change, "" when the interval stays.
  std::string set_interval(std::int64_t interval, const char* why);
  void report_unconfirmed();

  mixtrain::sdk::Logger logger_;
  // Lines (info: true, debug: false) of the last update(false), written once it stands.
  std::vector<std::pair<bool, std::string>> unconfirmed_;
  // Configuration.
  double growth_factor_ = 2.0;
  double backoff_factor_ = 0.5;
  std::int64_t min_interval_ = 50;
  std::int64_t max_interval_ = 2000;
  // Trajectory: everything update() reads.
  float scale_ = 65536.0f;
  std::int64_t interval_ = 50;
  std::int64_t streak_ = 0;                // finite steps in a row
  std::int64_t since_growth_ = 0;          // steps since the scale last grew
  std::int64_t since_overflow_ = 0;        // steps since the last overflow (or the start)
  bool grew_since_overflow_ = false;
  std::int64_t steps_ = 0;
  std::int64_t skipped_steps_ = 0;
};

}  // namespace mixtrain_samples
