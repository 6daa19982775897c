// StaticLossScaler ("static"): a constant loss scale chosen by the user.
//
// Contract: scale() is the configured `scale` for the whole run. update(found_inf) skips the
// optimizer step when the gradients are not finite and logs a warning with the step number and
// the scale (a static scale that overflows repeatedly is too large); the scale never changes.
// State: the scale it ran with and the update / skip counts. On load the configured scale wins;
// a different saved scale is reported, not adopted, because the config is the user's intent.
#pragma once

#include <cstdint>

#include "mixtrain/sdk/loss_scaler.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/plugin.h"

namespace mixtrain::scalers {

class StaticLossScaler final : public sdk::LossScaler {
 public:
  static constexpr std::int64_t kStateVersion = 1;
  static sdk::OptionSchema option_schema();

  StaticLossScaler(const sdk::Options& options, const sdk::PluginContext& context);

  float scale() const override { return scale_; }
  sdk::ScalerDecision update(bool found_inf) override;
  sdk::ComponentState save_state() const override;
  void load_state(const sdk::ComponentState& state) override;

  std::int64_t steps() const { return steps_; }
  std::int64_t skipped_steps() const { return skipped_steps_; }

 private:
  sdk::Logger logger_;
  float scale_ = 65536.0f;
  std::int64_t steps_ = 0;
  std::int64_t skipped_steps_ = 0;
};

}  // namespace mixtrain::scalers
