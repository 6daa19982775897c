// DynamicLossScaler ("dynamic"): PyTorch GradScaler semantics, plus DeepSpeed-style hysteresis
// and an optional floor / ceiling on the scale.
//
// Contract (one update() per step, found_inf = any non-finite unscaled gradient):
// - found_inf: the optimizer step is skipped and the growth tracker resets to 0. If the
//   hysteresis counter is > 1 it is decremented and the scale is kept; otherwise the scale backs
//   off to max(scale * backoff_factor, min_scale) and the counter stays at 1, so every further
//   overflow backs off until the counter is restored.
// - finite: the step is applied and the tracker increments; when it reaches growth_interval the
//   scale grows to min(scale * growth_factor, max_scale) (kept when that is not a finite float,
//   as PyTorch does), the tracker resets and the hysteresis counter is restored to `hysteresis`.
//   With consecutive_hysteresis the counter is also restored by every finite step, so only
//   back-to-back overflows use it up (DeepSpeed's flag of the same name).
// - hysteresis = 1 (default) is exactly torch.cuda.amp.GradScaler.
// State: scale, growth tracker, hysteresis counter and step / skip counts (version 1). Loading
// state saved under other growth_interval / hysteresis / min/max settings clamps to the new ones.
#pragma once

#include <cstdint>
#include <string>

#include "mixtrain/sdk/loss_scaler.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/plugin.h"

namespace mixtrain::scalers {

class DynamicLossScaler final : public sdk::LossScaler {
 public:
  static constexpr std::int64_t kStateVersion = 1;
  static sdk::OptionSchema option_schema();

  DynamicLossScaler(const sdk::Options& options, const sdk::PluginContext& context);
  ~DynamicLossScaler() override;

  float scale() const override { return scale_; }
  sdk::ScalerDecision update(bool found_inf) override;
  sdk::ComponentState save_state() const override;
  void load_state(const sdk::ComponentState& state) override;

  std::int64_t growth_tracker() const { return growth_tracker_; }
  std::int64_t hysteresis_left() const { return hysteresis_left_; }
  std::int64_t steps() const { return steps_; }
  std::int64_t skipped_steps() const { return skipped_steps_; }

 private:
  void back_off();
  void grow();
  void report_growth();

  sdk::Logger logger_;
  // The debug line of a growth, written once the update that made it stands: the gated host may
  // take an update(false) back with load_state() (sdk/loss_scaler.h).
  std::string unconfirmed_growth_;
  // Configuration.
  double growth_factor_ = 2.0;
  double backoff_factor_ = 0.5;
  std::int64_t growth_interval_ = 2000;
  std::int64_t hysteresis_ = 1;
  bool consecutive_hysteresis_ = false;
  double min_scale_ = 0.0;
  double max_scale_ = 0.0;
  // Trajectory: everything update() reads.
  float scale_ = 65536.0f;
  std::int64_t growth_tracker_ = 0;
  std::int64_t hysteresis_left_ = 1;
  std::int64_t steps_ = 0;
  std::int64_t skipped_steps_ = 0;
};

}  // namespace mixtrain::scalers
