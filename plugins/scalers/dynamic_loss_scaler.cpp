#include "dynamic_loss_scaler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "scaler_state.h"

namespace mixtrain::scalers {

sdk::OptionSchema DynamicLossScaler::option_schema() {
  using sdk::OptionSpec;
  return {
      OptionSpec::number("init_scale", 65536.0, "loss scale of the first step").greater_than(0),
      OptionSpec::number("growth_factor", 2.0,
                         "scale multiplier after growth_interval finite steps in a row")
          .greater_than(1),
      OptionSpec::number("backoff_factor", 0.5, "scale multiplier on overflow; must be < 1")
          .greater_than(0)
          .at_most(1),
      OptionSpec::integer("growth_interval", 2000, "finite steps in a row before the scale grows")
          .at_least(1),
      OptionSpec::integer("hysteresis", 1,
                          "overflows tolerated before backing off (1 = back off on every one)")
          .at_least(1),
      OptionSpec::boolean("consecutive_hysteresis", false,
                          "restore the hysteresis budget on every finite step, not only on "
                          "growth"),
      OptionSpec::number("min_scale", 0.0, "floor of the scale (0 = none)").at_least(0),
      OptionSpec::number("max_scale", std::numeric_limits<double>::infinity(),
                         "ceiling of the scale; inf = none")
          .greater_than(0)
          .allow_infinity(),
  };
}

DynamicLossScaler::DynamicLossScaler(const sdk::Options& options, const sdk::PluginContext& context)
    : logger_(context.logger),
      growth_factor_(options.get_double("growth_factor")),
      backoff_factor_(options.get_double("backoff_factor")),
      growth_interval_(options.get_int("growth_interval")),
      hysteresis_(options.get_int("hysteresis")),
      consecutive_hysteresis_(options.get_bool("consecutive_hysteresis")),
      min_scale_(options.get_double("min_scale")),
      max_scale_(options.get_double("max_scale")) {
  const double init_scale = options.get_double("init_scale");
  if (backoff_factor_ >= 1.0)
    options.fail("backoff_factor", "must be < 1, got " + format_scale(backoff_factor_),
                 "the scale must shrink after an overflow; PyTorch's default is 0.5");
  if (init_scale > FLT_MAX)
    options.fail("init_scale", "value " + format_scale(init_scale) + " does not fit in a float",
                 "use a power of two such as 65536");
  if (min_scale_ > init_scale) {
    const char* key = options.was_set("min_scale") ? "min_scale" : "init_scale";
    options.fail(
        key,
        "min_scale " + format_scale(min_scale_) + " exceeds init_scale " + format_scale(init_scale),
        "min_scale <= init_scale <= max_scale must hold");
  }
  if (init_scale > max_scale_) {
    const char* key = options.was_set("max_scale") ? "max_scale" : "init_scale";
    options.fail(
        key,
        "init_scale " + format_scale(init_scale) + " exceeds max_scale " + format_scale(max_scale_),
        "min_scale <= init_scale <= max_scale must hold");
  }
  scale_ = static_cast<float>(init_scale);
  hysteresis_left_ = hysteresis_;
  logger_.debug("dynamic loss scale " + format_scale(scale_) + ", x" +
                format_scale(growth_factor_) + " every " + std::to_string(growth_interval_) +
                " finite steps, x" + format_scale(backoff_factor_) + " on overflow, hysteresis " +
                std::to_string(hysteresis_));
}

DynamicLossScaler::~DynamicLossScaler() {
  report_growth();
}

void DynamicLossScaler::report_growth() {
  if (!unconfirmed_growth_.empty()) logger_.debug(unconfirmed_growth_);
  unconfirmed_growth_.clear();
}

sdk::ScalerDecision DynamicLossScaler::update(bool found_inf) {
  report_growth();  // the last update stood: no load_state() came between
  sdk::ScalerDecision decision;
  decision.scale_before = scale_;
  count_up(steps_);
  if (found_inf) {
    decision.apply_step = false;
    count_up(skipped_steps_);
    growth_tracker_ = 0;
    if (hysteresis_left_ > 1) {
      --hysteresis_left_;
      logger_.info("step " + std::to_string(steps_) +
                   ": non-finite gradients, step skipped; hysteresis keeps scale " +
                   format_scale(scale_) + " (" + std::to_string(hysteresis_left_ - 1) +
                   " more overflow(s) tolerated)");
    } else {
      back_off();
    }
  } else {
    if (consecutive_hysteresis_) hysteresis_left_ = hysteresis_;
    if (++growth_tracker_ == growth_interval_) {
      growth_tracker_ = 0;
      hysteresis_left_ = hysteresis_;
      grow();
    }
  }
  decision.scale_after = scale_;
  return decision;
}

void DynamicLossScaler::back_off() {
  const float before = scale_;
  // min_scale <= init_scale <= FLT_MAX, so the result always fits in a float. It stays positive
  // (the smallest float at least, when min_scale is 0): a scale rounded to 0 would be a state
  // load_state() refuses, and the host saves and restores the scaler's state around its
  // decision (docs/architecture.md, "The gated update"). Down there every unscale overflows
  // either way, so the run skips on as it would at 0.
  const double floor =
      std::max(min_scale_, static_cast<double>(std::numeric_limits<float>::denorm_min()));
  scale_ = static_cast<float>(std::max(static_cast<double>(scale_) * backoff_factor_, floor));
  logger_.info("step " + std::to_string(steps_) + ": non-finite gradients, step skipped; scale " +
               format_scale(before) + " -> " + format_scale(scale_) +
               (scale_ == before ? " (at its floor)" : ""));
}

void DynamicLossScaler::grow() {
  const float before = scale_;
  const double grown = std::min(static_cast<double>(scale_) * growth_factor_, max_scale_);
  // Like PyTorch, never grow into inf: an infinite scale would turn every gradient into inf.
  if (grown <= FLT_MAX) scale_ = static_cast<float>(grown);
  unconfirmed_growth_ = "step " + std::to_string(steps_) + ": " + std::to_string(growth_interval_) +
                        " finite steps, scale " + format_scale(before) + " -> " +
                        format_scale(scale_) + (scale_ == before ? " (at max_scale)" : "");
}

sdk::ComponentState DynamicLossScaler::save_state() const {
  sdk::ComponentState state;
  state.version = kStateVersion;
  state.values["scale"] = static_cast<double>(scale_);
  state.values["growth_tracker"] = growth_tracker_;
  state.values["hysteresis_left"] = hysteresis_left_;
  // The budget hysteresis_left counts down from, so load_state() tells a damaged counter from a
  // config change (absent in checkpoints written before it was saved).
  state.values["hysteresis"] = hysteresis_;
  state.values["steps"] = steps_;
  state.values["skipped_steps"] = skipped_steps_;
  return state;
}

void DynamicLossScaler::load_state(const sdk::ComponentState& state) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  unconfirmed_growth_.clear();  // of an update() this state takes back
  check_state_version(state, "dynamic", kStateVersion);
  float scale = read_state_scale(state, "dynamic", "scale");
  const auto steps = read_state_int(state, "dynamic", "steps", 0, kMax);
  const auto skipped = read_state_int(state, "dynamic", "skipped_steps", 0, steps);
  // The tracker counts finite steps since the last growth or overflow, and resets on reaching
  // growth_interval (<= INT64_MAX): at most the steps taken, never INT64_MAX.
  auto tracker = read_state_int(state, "dynamic", "growth_tracker", 0, std::min(steps, kMax - 1));
  const auto saved_hysteresis =
      state.has("hysteresis") ? read_state_int(state, "dynamic", "hysteresis", 1, kMax) : kMax;
  auto hysteresis_left = read_state_int(state, "dynamic", "hysteresis_left", 1, saved_hysteresis);

  // The values are well-formed; they may still predate a config change on resume.
  if (tracker >= growth_interval_) {
    logger_.info("checkpoint growth tracker " + std::to_string(tracker) +
                 " exceeds growth_interval " + std::to_string(growth_interval_) +
                 ": the scale grows after the next finite step");
    tracker = growth_interval_ - 1;
  }
  if (hysteresis_left > hysteresis_) {
    logger_.info("checkpoint hysteresis counter " + std::to_string(hysteresis_left) +
                 " exceeds hysteresis " + std::to_string(hysteresis_) + ", clamped");
    hysteresis_left = hysteresis_;
  }
  const double clamped = std::clamp(static_cast<double>(scale), min_scale_, max_scale_);
  if (clamped != static_cast<double>(scale)) {
    logger_.warn("checkpoint scale " + format_scale(scale) + " is outside [min_scale, max_scale]" +
                 ", clamped to " + format_scale(clamped));
    scale = static_cast<float>(clamped);
  }
  scale_ = scale;
  growth_tracker_ = tracker;
  hysteresis_left_ = hysteresis_left;
  steps_ = steps;
  skipped_steps_ = skipped;
}

}  // namespace mixtrain::scalers
