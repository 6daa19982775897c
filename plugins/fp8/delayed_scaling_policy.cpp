#include "delayed_scaling_policy.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

namespace mixtrain::fp8 {

namespace {
std::string_view algo_name(AmaxComputeAlgo a) {
  return a == AmaxComputeAlgo::max ? "max" : "most_recent";
}

AmaxComputeAlgo parse_algo(std::string_view name) {
  if (name == "max") return AmaxComputeAlgo::max;
  if (name == "most_recent") return AmaxComputeAlgo::most_recent;
  throw std::invalid_argument("unknown amax_compute_algo '" + std::string(name) + "'");
}

AmaxUpdate parse_update(std::string_view name) {
  if (name == "fused") return AmaxUpdate::fused;
  if (name == "unfused") return AmaxUpdate::unfused;
  throw std::invalid_argument("unknown amax_update '" + std::string(name) + "'");
}

std::string slot_key(std::size_t i, const char* field) {
  return "slot." + std::to_string(i) + "." + field;
}
}  // namespace

sdk::OptionSchema DelayedScalingPolicy::option_schema() {
  using sdk::OptionSpec;
  auto common = common_option_schema();  // fp8_format, margin, base
  return {
      common[0],
      common[1],
      OptionSpec::integer("amax_history_len", 1024,
                          "steps of amax kept per operand (the step in progress included)")
          .at_least(1)
          .at_most(static_cast<double>(kMaxHistoryLen)),
      OptionSpec::string(
          "amax_compute_algo", "max",
          "amax the scale is computed from: max over the history, or most_recent step")
          .one_of({"max", "most_recent"}),
      OptionSpec::string(
          "amax_update", "fused",
          "Transformer Engine's update: fused (a step with amax 0 leaves the slot alone, "
          "max skips NaN) or unfused (always rolls, NaN wins)")
          .one_of({"fused", "unfused"}),
      OptionSpec::integer("interval", 1, "recompute the scales every this many applied steps")
          .at_least(1),
      common[2],
  };
}

DelayedScalingPolicy::DelayedScalingPolicy(const sdk::Options& options,
                                           const sdk::PluginContext& context)
    : Fp8PrecisionPolicy("fp8-delayed", options, context),
      history_len_(static_cast<std::size_t>(options.get_int("amax_history_len"))),
      algo_(parse_algo(options.get_string("amax_compute_algo"))),
      update_(parse_update(options.get_string("amax_update"))),
      interval_(options.get_int("interval")) {}

ScalingSlot& DelayedScalingPolicy::slot_for(const sdk::OperandSlot& slot) {
  auto it = slots_.find(slot.name());
  if (it == slots_.end())
    it = slots_
             .emplace(slot.name(),
                      ScalingSlot{operand_dtype(format(), slot.role()), AmaxHistory(history_len_)})
             .first;
  return it->second;
}

const ScalingSlot* DelayedScalingPolicy::slot(std::string_view name) const {
  auto it = slots_.find(name);
  return it == slots_.end() ? nullptr : &it->second;
}

std::vector<std::string> DelayedScalingPolicy::slot_names() const {
  std::vector<std::string> names;
  for (const auto& [name, s] : slots_) names.push_back(name);
  return names;
}

sdk::OperandScaling DelayedScalingPolicy::operand_scaling(const sdk::OperandSlot& slot) {
  const auto& s = slot_for(slot);
  return {s.dtype, s.scale, s.scale_inv};
}

void DelayedScalingPolicy::record_amax(const sdk::OperandSlot& slot, float amax) {
  slot_for(slot).history.record(amax);
}

float DelayedScalingPolicy::history_amax(const AmaxHistory& history) const {
  if (algo_ == AmaxComputeAlgo::most_recent) return history.current();
  return update_ == AmaxUpdate::fused ? history.max_ignoring_nan() : history.max();
}

void DelayedScalingPolicy::warn_non_finite(const std::string& name, const ScalingSlot& s) const {
  const float amax = s.history.current();
  std::string effect;
  if (algo_ == AmaxComputeAlgo::most_recent)
    effect = "the scale stays at " + format_float(s.scale) + " for this step";
  else if (std::isnan(amax) && update_ == AmaxUpdate::fused)
    effect = "the max over the amax history skips it";
  else
    effect = "the scale stays at " + format_float(s.scale) + " while it is in the amax history";
  logger().warn(name + ": non-finite amax " + format_float(amax) + " observed; " + effect);
}

void DelayedScalingPolicy::set_scale(const std::string& name, ScalingSlot& s, float amax,
                                     float new_scale) const {
  if (logger().enabled(sdk::LogLevel::debug))
    logger().debug(name + ": amax " + format_float(amax) + " -> scale " + format_float(new_scale) +
                   " (was " + format_float(s.scale) + ")");
  s.scale = new_scale;
  s.scale_inv = 1.0f / new_scale;
}

void DelayedScalingPolicy::on_step_end(bool applied) {
  if (!applied) {
    for (auto& [name, s] : slots_) s.history.discard_current();
    return;
  }
  // A count restored from a checkpoint may be at the top: stop there rather than overflow.
  if (applied_steps_ < std::numeric_limits<std::int64_t>::max()) ++applied_steps_;
  const bool recompute = applied_steps_ % interval_ == 0;
  for (auto& [name, s] : slots_) {
    // Transformer Engine's fused kernel skips a slot whose amax is 0 (-0 included): an operand
    // not cast this step, or all zeros, says nothing about its range. NaN is not 0: it rolls.
    if (update_ == AmaxUpdate::fused && s.history.current() == 0.0f) continue;
    if (!std::isfinite(s.history.current())) warn_non_finite(name, s);
    if (recompute) {
      const float amax = history_amax(s.history);
      if (auto scale = compute_scale(amax, s.dtype, margin())) set_scale(name, s, amax, *scale);
    }
    s.history.roll();
  }
}

sdk::ComponentState DelayedScalingPolicy::save_state() const {
  sdk::ComponentState state;
  state.version = kStateVersion;
  save_recipe(state);
  state.values["amax_history_len"] = static_cast<std::int64_t>(history_len_);
  state.values["amax_compute_algo"] = std::string(algo_name(algo_));
  state.values["interval"] = interval_;
  state.values["applied_steps"] = applied_steps_;
  state.values["slots"] = static_cast<std::int64_t>(slots_.size());
  std::size_t i = 0;
  for (const auto& [name, s] : slots_) {
    state.values[slot_key(i, "name")] = name;
    state.values[slot_key(i, "amax_history")] = s.history.ring();
    state.values[slot_key(i, "position")] = static_cast<std::int64_t>(s.history.position());
    state.values[slot_key(i, "scale")] = static_cast<double>(s.scale);
    ++i;
  }
  return state;
}

void DelayedScalingPolicy::load_state(const sdk::ComponentState& state) {
  check_state_version(state, kStateVersion);
  const bool constants_changed = report_recipe_changes(state);
  const auto saved_len = read_int(state, "amax_history_len", 1, kMaxHistoryLen);
  const auto& saved_algo = read_string(state, "amax_compute_algo");
  if (saved_algo != "max" && saved_algo != "most_recent")
    fail_state("entry 'amax_compute_algo' = '" + saved_algo + "' is not max or most_recent");
  const auto saved_interval =
      read_int(state, "interval", 1, std::numeric_limits<std::int64_t>::max());
  const auto applied =
      read_int(state, "applied_steps", 0, std::numeric_limits<std::int64_t>::max());
  const auto count = read_int(state, "slots", 0, std::numeric_limits<std::int32_t>::max());

  std::map<std::string, ScalingSlot, std::less<>> loaded;
  std::size_t kept_scales = 0;  // constants changed, but no amax to recompute the scale from
  for (std::size_t i = 0; i < static_cast<std::size_t>(count); ++i) {
    const auto name_key = slot_key(i, "name");
    const auto [name, role] = read_slot_name(state, name_key);
    const auto history_key = slot_key(i, "amax_history");
    const auto& ring = state.get<std::vector<float>>(history_key);
    if (static_cast<std::int64_t>(ring.size()) != saved_len)
      fail_state("entry '" + history_key + "' holds " + std::to_string(ring.size()) +
                 " amaxes, but the state's amax_history_len is " + std::to_string(saved_len));
    for (float a : ring)
      if (a < 0.0f)
        fail_state("entry '" + history_key + "' holds a negative amax " + format_float(a));
    const auto position = read_int(state, slot_key(i, "position"), 0, saved_len - 1);
    ScalingSlot s{operand_dtype(format(), role),
                  AmaxHistory(ring, static_cast<std::size_t>(position)),
                  read_scale(state, slot_key(i, "scale"))};
    if (s.history.length() != history_len_) s.history = s.history.resized(history_len_);
    if (constants_changed) {
      // Saved scales were derived for another fp8_max or margin; the history is still valid. A
      // checkpoint is written after the step's roll, so the entry in progress is empty: the
      // "most_recent" amax is the last completed step's (what the saved scale came from).
      const float amax = algo_ == AmaxComputeAlgo::most_recent ? s.history.last_completed()
                                                               : history_amax(s.history);
      if (auto scale = compute_scale(amax, s.dtype, margin()))
        s.scale = *scale;
      else
        ++kept_scales;
    }
    s.scale_inv = 1.0f / s.scale;
    if (!loaded.emplace(name, std::move(s)).second) fail_state("slot '" + name + "' appears twice");
  }

  if (saved_len != static_cast<std::int64_t>(history_len_)) {
    const auto kept = std::min<std::int64_t>(saved_len, static_cast<std::int64_t>(history_len_));
    logger().warn("policy fp8-delayed: checkpoint has amax_history_len " +
                  std::to_string(saved_len) + ", the config says " + std::to_string(history_len_) +
                  "; kept the most recent " + std::to_string(kept) + " amaxes of each of " +
                  std::to_string(loaded.size()) + " slots" +
                  (saved_len < static_cast<std::int64_t>(history_len_)
                       ? ", padded with zeros on the oldest side"
                       : ", dropped the " + std::to_string(saved_len - kept) + " oldest"));
  }
  if (saved_algo != algo_name(algo_))
    logger().info("policy fp8-delayed: checkpoint used amax_compute_algo " + saved_algo +
                  ", the config says " + std::string(algo_name(algo_)) + "; the config wins");
  if (saved_interval != interval_)
    logger().info("policy fp8-delayed: checkpoint used interval " + std::to_string(saved_interval) +
                  ", the config says " + std::to_string(interval_) + "; the config wins");
  if (constants_changed)
    logger().warn(
        "policy fp8-delayed: fp8_format or margin changed since the checkpoint; " +
        std::to_string(loaded.size() - kept_scales) + " of the " + std::to_string(loaded.size()) +
        " scales were recomputed from their amax histories" +
        (kept_scales == 0 ? std::string()
                          : "; " + std::to_string(kept_scales) +
                                " kept the saved scale until the next update (no completed amax: "
                                "a history of one entry, or an operand never cast)"));
  report_slot_migration(state, loaded.size());

  slots_ = std::move(loaded);
  applied_steps_ = applied;
}

}  // namespace mixtrain::fp8
