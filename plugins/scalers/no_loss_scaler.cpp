#include "no_loss_scaler.h"

#include <limits>

#include "scaler_state.h"

namespace mixtrain::scalers {

sdk::OptionSchema NoLossScaler::option_schema() {
  return {};
}

NoLossScaler::NoLossScaler(const sdk::Options& /*options*/, const sdk::PluginContext& context)
    : logger_(context.logger) {
  logger_.debug("loss scaling off (scale 1)");
}

sdk::ScalerDecision NoLossScaler::update(bool found_inf) {
  count_up(steps_);
  if (found_inf) {
    count_up(skipped_steps_);
    logger_.warn("step " + std::to_string(steps_) +
                 ": non-finite gradients without a loss scaler, optimizer step skipped (" +
                 std::to_string(skipped_steps_) + " skipped so far)");
  }
  return {!found_inf, 1.0f, 1.0f};
}

sdk::ComponentState NoLossScaler::save_state() const {
  sdk::ComponentState state;
  state.version = kStateVersion;
  state.values["steps"] = steps_;
  state.values["skipped_steps"] = skipped_steps_;
  return state;
}

void NoLossScaler::load_state(const sdk::ComponentState& state) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  check_state_version(state, "none", kStateVersion);
  const auto steps = read_state_int(state, "none", "steps", 0, kMax);
  const auto skipped = read_state_int(state, "none", "skipped_steps", 0, steps);
  steps_ = steps;
  skipped_steps_ = skipped;
}

}  // namespace mixtrain::scalers
