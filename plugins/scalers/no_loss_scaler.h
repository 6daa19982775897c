// NoLossScaler ("none"): loss scale fixed at 1, for policies whose formats do not underflow
// (fp32, tf32, bf16).
//
// Contract: scale() is always 1. update(found_inf) still refuses the optimizer step when the
// gradients are not finite, so FP32 master weights are never corrupted by an inf/NaN; such a
// step is counted and logged as a warning. State: the update and skip counts.
#pragma once

#include <cstdint>

#include "mixtrain/sdk/loss_scaler.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/plugin.h"

namespace mixtrain::scalers {

class NoLossScaler final : public sdk::LossScaler {
 public:
  static constexpr std::int64_t kStateVersion = 1;
  static sdk::OptionSchema option_schema();

  NoLossScaler(const sdk::Options& options, const sdk::PluginContext& context);

  float scale() const override { return 1.0f; }
  sdk::ScalerDecision update(bool found_inf) override;
  sdk::ComponentState save_state() const override;
  void load_state(const sdk::ComponentState& state) override;

  std::int64_t steps() const { return steps_; }
  std::int64_t skipped_steps() const { return skipped_steps_; }

 private:
  sdk::Logger logger_;
  std::int64_t steps_ = 0;
  std::int64_t skipped_steps_ = 0;
};

}  // namespace mixtrain::scalers
