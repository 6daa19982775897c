#include "static_loss_scaler.h"

#include <cfloat>
#include <limits>

#include "scaler_state.h"

namespace mixtrain::scalers {

sdk::OptionSchema StaticLossScaler::option_schema() {
  return {sdk::OptionSpec::number("scale", 65536.0,
                                  "constant factor the loss is multiplied by before backward")
              .greater_than(0)};
}

StaticLossScaler::StaticLossScaler(const sdk::Options& options, const sdk::PluginContext& context)
    : logger_(context.logger) {
  const double scale = options.get_double("scale");
  if (scale > FLT_MAX)
    options.fail("scale", "value " + format_scale(scale) + " does not fit in a float",
                 "use a power of two such as 65536");
  scale_ = static_cast<float>(scale);
  logger_.debug("static loss scale " + format_scale(scale_));
}

sdk::ScalerDecision StaticLossScaler::update(bool found_inf) {
  count_up(steps_);
  if (found_inf) {
    count_up(skipped_steps_);
    logger_.warn("step " + std::to_string(steps_) + ": non-finite gradients at static scale " +
                 format_scale(scale_) + ", optimizer step skipped (" +
                 std::to_string(skipped_steps_) +
                 " skipped so far); if this repeats, lower scaler.scale or use type = \"dynamic\"");
  }
  return {!found_inf, scale_, scale_};
}

sdk::ComponentState StaticLossScaler::save_state() const {
  sdk::ComponentState state;
  state.version = kStateVersion;
  state.values["scale"] = static_cast<double>(scale_);
  state.values["steps"] = steps_;
  state.values["skipped_steps"] = skipped_steps_;
  return state;
}

void StaticLossScaler::load_state(const sdk::ComponentState& state) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  check_state_version(state, "static", kStateVersion);
  const float saved_scale = read_state_scale(state, "static", "scale");
  const auto steps = read_state_int(state, "static", "steps", 0, kMax);
  const auto skipped = read_state_int(state, "static", "skipped_steps", 0, steps);
  if (saved_scale != scale_)
    logger_.warn("checkpoint was written with static scale " + format_scale(saved_scale) +
                 ", continuing with the configured scale " + format_scale(scale_));
  steps_ = steps;
  skipped_steps_ = skipped;
}

}  // namespace mixtrain::scalers
