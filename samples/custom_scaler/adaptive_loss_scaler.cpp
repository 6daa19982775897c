#include "adaptive_loss_scaler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "mixtrain/sdk/error.h"

namespace mixtrain_samples {

namespace sdk = mixtrain::sdk;

namespace {

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// A damaged or foreign checkpoint must fail loudly, never yield a silently wrong trajectory.
std::int64_t read_int(const sdk::ComponentState& state, const std::string& key, std::int64_t min,
                      std::int64_t max) {
  const auto v = state.get<std::int64_t>(key);
  if (v < min || v > max)
    throw sdk::CheckpointError("scaler 'adaptive' state entry '" + key + "' = " +
                                   std::to_string(v) + " is outside [" + std::to_string(min) +
                                   ", " + std::to_string(max) + "]",
                               "the checkpoint is damaged or was written by another scaler");
  return v;
}

}  // namespace

sdk::OptionSchema AdaptiveLossScaler::option_schema() {
  using sdk::OptionSpec;
  return {
      OptionSpec::number("init_scale", 65536.0, "loss scale of the first step")
          .greater_than(0)
          .at_most(FLT_MAX),
      OptionSpec::number("growth_factor", 2.0, "scale multiplier after a clean streak")
          .greater_than(1),
      OptionSpec::number("backoff_factor", 0.5, "scale multiplier on every overflow")
          .greater_than(0)
          .at_most(0.99),
      OptionSpec::integer("min_interval", 50, "shortest clean streak before growing; the start")
          .at_least(1),
      OptionSpec::integer("max_interval", 2000, "longest clean streak before growing")
          .at_least(1),
  };
}

AdaptiveLossScaler::AdaptiveLossScaler(const sdk::Options& options,
                                       const sdk::PluginContext& context)
    : logger_(context.logger),
      growth_factor_(options.get_double("growth_factor")),
      backoff_factor_(options.get_double("backoff_factor")),
      min_interval_(options.get_int("min_interval")),
      max_interval_(options.get_int("max_interval")) {
  // A cross-key rule the schema cannot express: reported at the offending key's file:line:col.
  if (max_interval_ < min_interval_) {
    const char* key = options.was_set("max_interval") ? "max_interval" : "min_interval";
    options.fail(key,
                 "max_interval " + std::to_string(max_interval_) + " is below min_interval " +
                     std::to_string(min_interval_),
                 "min_interval <= max_interval must hold");
  }
  scale_ = static_cast<float>(options.get_double("init_scale"));
  interval_ = min_interval_;
  logger_.info("adaptive loss scale " + fmt(scale_) + ": x" + fmt(growth_factor_) +
               " after a clean streak of " + std::to_string(min_interval_) + ".." +
               std::to_string(max_interval_) + " steps (adapted to the overflow rate), x" +
               fmt(backoff_factor_) + " on overflow");
}

AdaptiveLossScaler::~AdaptiveLossScaler() {
  report_unconfirmed();
}

void AdaptiveLossScaler::report_unconfirmed() {
  for (const auto& [info, line] : unconfirmed_) {
    if (info)
      logger_.info(line);
    else
      logger_.debug(line);
  }
  unconfirmed_.clear();
}

sdk::ScalerDecision AdaptiveLossScaler::update(bool found_inf) {
  // The last step's decision stood (no load_state() came between): what it did can be said.
  report_unconfirmed();
  sdk::ScalerDecision decision;
  decision.scale_before = scale_;
  ++steps_;
  ++since_growth_;
  ++since_overflow_;
  if (found_inf)
    on_overflow();
  else
    on_finite();
  decision.apply_step = !found_inf;
  decision.scale_after = scale_;
  return decision;
}

void AdaptiveLossScaler::on_overflow() {
  ++skipped_steps_;
  // The grown scale did not survive as long as it took to earn it: grow more cautiously.
  if (grew_since_overflow_ && since_growth_ <= interval_)
    if (auto line =
            set_interval(std::min(interval_ * 2, max_interval_), "overflow soon after growth");
        !line.empty())
      logger_.info(line);  // found_inf = true is never taken back
  const float before = scale_;
  scale_ = static_cast<float>(std::max(static_cast<double>(scale_) * backoff_factor_,
                                       static_cast<double>(FLT_MIN)));
  logger_.info("step " + std::to_string(steps_) + ": non-finite gradients, step skipped; scale " +
               fmt(before) + " -> " + fmt(scale_));
  streak_ = 0;
  since_overflow_ = 0;
  grew_since_overflow_ = false;
}

void AdaptiveLossScaler::on_finite() {
  if (++streak_ < interval_) return;
  streak_ = 0;
  // Long quiet: the interval is more cautious than this model needs.
  // Said once the decision stands: under the gated update this may be a tentative
  // update(false) that load_state() takes back (sdk/loss_scaler.h).
  if (since_overflow_ >= 4 * interval_)
    if (auto line = set_interval(std::max(interval_ / 2, min_interval_), "long clean period");
        !line.empty())
      unconfirmed_.emplace_back(true, std::move(line));
  const double grown = static_cast<double>(scale_) * growth_factor_;
  if (grown > FLT_MAX) return;  // never grow into inf: every gradient would overflow
  unconfirmed_.emplace_back(
      false, "step " + std::to_string(steps_) + ": scale " + fmt(scale_) + " -> " + fmt(grown));
  scale_ = static_cast<float>(grown);
  since_growth_ = 0;
  grew_since_overflow_ = true;
}

std::string AdaptiveLossScaler::set_interval(std::int64_t interval, const char* why) {
  if (interval == interval_) return {};
  std::string line = "step " + std::to_string(steps_) + ": " + why + ", growth interval " +
                     std::to_string(interval_) + " -> " + std::to_string(interval);
  interval_ = interval;
  return line;
}

sdk::ComponentState AdaptiveLossScaler::save_state() const {
  sdk::ComponentState state;
  state.version = kStateVersion;
  state.values["scale"] = static_cast<double>(scale_);
  state.values["interval"] = interval_;
  state.values["streak"] = streak_;
  state.values["since_growth"] = since_growth_;
  state.values["since_overflow"] = since_overflow_;
  state.values["grew_since_overflow"] = grew_since_overflow_;
  state.values["steps"] = steps_;
  state.values["skipped_steps"] = skipped_steps_;
  return state;
}

void AdaptiveLossScaler::load_state(const sdk::ComponentState& state) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  unconfirmed_.clear();  // of an update() this state takes back
  if (state.version < 1 || state.version > kStateVersion)
    throw sdk::CheckpointError("scaler 'adaptive' state has version " +
                                   std::to_string(state.version) + ", this build reads 1.." +
                                   std::to_string(kStateVersion),
                               "resume with the plugin version that wrote the checkpoint");
  const double scale = state.get<double>("scale");
  if (!std::isfinite(scale) || scale <= 0.0 || scale > FLT_MAX)
    throw sdk::CheckpointError("scaler 'adaptive' state entry 'scale' = " + fmt(scale) +
                                   " is not a positive finite float",
                               "the checkpoint is damaged or was written by another scaler");
  auto interval = read_int(state, "interval", 1, kMax);
  const auto streak = read_int(state, "streak", 0, kMax);
  const auto since_growth = read_int(state, "since_growth", 0, kMax);
  const auto since_overflow = read_int(state, "since_overflow", 0, kMax);
  const auto steps = read_int(state, "steps", 0, kMax);
  const auto skipped = read_int(state, "skipped_steps", 0, steps);
  const bool grew = state.get<bool>("grew_since_overflow");

  // Well-formed, but the run may resume with other bounds in its config.
  const auto clamped = std::clamp(interval, min_interval_, max_interval_);
  if (clamped != interval) {
    logger_.info("checkpoint growth interval " + std::to_string(interval) +
                 " is outside [min_interval, max_interval], clamped to " +
                 std::to_string(clamped));
    interval = clamped;
  }
  scale_ = static_cast<float>(scale);
  interval_ = interval;
  streak_ = std::min(streak, interval_ - 1);
  since_growth_ = since_growth;
  since_overflow_ = since_overflow;
  grew_since_overflow_ = grew;
  steps_ = steps;
  skipped_steps_ = skipped;
}

}  // namespace mixtrain_samples

namespace {

std::vector<mixtrain::sdk::ComponentInfo> components() {
  using mixtrain_samples::AdaptiveLossScaler;
  return {{mixtrain::sdk::ComponentKind::scaler, "adaptive",
           "dynamic loss scale whose growth interval adapts to the overflow rate",
           AdaptiveLossScaler::option_schema(),
           &mixtrain::sdk::make_component<AdaptiveLossScaler>}};
}

}  // namespace

MIXTRAIN_PLUGIN("adaptive_scaler", "1.0.0", components)
