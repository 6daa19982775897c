#include "current_scaling_policy.h"

#include <cmath>
#include <limits>
#include <utility>

namespace mixtrain::fp8 {

namespace {
std::string slot_key(std::size_t i, const char* field) {
  return "slot." + std::to_string(i) + "." + field;
}
}  // namespace

CurrentScalingPolicy::CurrentScalingPolicy(const sdk::Options& options,
                                           const sdk::PluginContext& context)
    : Fp8PrecisionPolicy("fp8-current", options, context) {}

CurrentScalingSlot& CurrentScalingPolicy::slot_for(const sdk::OperandSlot& slot) {
  auto it = slots_.find(slot.name());
  if (it == slots_.end()) {
    CurrentScalingSlot s;
    s.dtype = operand_dtype(format(), slot.role());
    it = slots_.emplace(slot.name(), s).first;
  }
  return it->second;
}

const CurrentScalingSlot* CurrentScalingPolicy::slot(std::string_view name) const {
  auto it = slots_.find(name);
  return it == slots_.end() ? nullptr : &it->second;
}

std::vector<std::string> CurrentScalingPolicy::slot_names() const {
  std::vector<std::string> names;
  for (const auto& [name, s] : slots_) names.push_back(name);
  return names;
}

sdk::OperandScaling CurrentScalingPolicy::operand_scaling(const sdk::OperandSlot& slot) {
  const auto& s = slot_for(slot);
  return {s.dtype, s.scale, s.scale_inv};
}

void CurrentScalingPolicy::record_amax(const sdk::OperandSlot& slot, float amax) {
  auto& s = slot_for(slot);
  s.amax = amax;
  if (auto scale = compute_scale(amax, s.dtype, margin())) {
    s.scale = *scale;
    s.scale_inv = 1.0f / *scale;
  }
}

void CurrentScalingPolicy::on_step_end(bool applied) {
  for (auto& [name, s] : slots_) {
    if (!applied) {
      s.amax = s.committed_amax;
      s.scale = s.committed_scale;
      s.scale_inv = 1.0f / s.scale;
      continue;
    }
    if (!std::isfinite(s.amax))
      logger().warn(name + ": non-finite amax " + format_float(s.amax) +
                    " observed; the scale stays at " + format_float(s.scale));
    if (s.scale != s.committed_scale && logger().enabled(sdk::LogLevel::debug))
      logger().debug(name + ": amax " + format_float(s.amax) + " -> scale " +
                     format_float(s.scale) + " (was " + format_float(s.committed_scale) + ")");
    s.committed_amax = s.amax;
    s.committed_scale = s.scale;
  }
}

sdk::ComponentState CurrentScalingPolicy::save_state() const {
  sdk::ComponentState state;
  state.version = kStateVersion;
  save_recipe(state);
  state.values["slots"] = static_cast<std::int64_t>(slots_.size());
  std::size_t i = 0;
  for (const auto& [name, s] : slots_) {
    state.values[slot_key(i, "name")] = name;
    state.values[slot_key(i, "amax")] = static_cast<double>(s.committed_amax);
    state.values[slot_key(i, "scale")] = static_cast<double>(s.committed_scale);
    ++i;
  }
  return state;
}

void CurrentScalingPolicy::load_state(const sdk::ComponentState& state) {
  check_state_version(state, kStateVersion);
  const bool constants_changed = report_recipe_changes(state);
  const auto count = read_int(state, "slots", 0, std::numeric_limits<std::int32_t>::max());
  std::map<std::string, CurrentScalingSlot, std::less<>> loaded;
  for (std::size_t i = 0; i < static_cast<std::size_t>(count); ++i) {
    const auto name_key = slot_key(i, "name");
    const auto [name, role] = read_slot_name(state, name_key);
    const auto amax_key = slot_key(i, "amax");
    const double amax = state.get<double>(amax_key);
    if (amax < 0.0) fail_state("entry '" + amax_key + "' = " + format_float(amax) + " is negative");
    CurrentScalingSlot s;
    s.dtype = operand_dtype(format(), role);
    s.amax = static_cast<float>(amax);
    s.scale = read_scale(state, slot_key(i, "scale"));
    if (constants_changed)
      if (auto scale = compute_scale(s.amax, s.dtype, margin())) s.scale = *scale;
    s.scale_inv = 1.0f / s.scale;
    s.committed_amax = s.amax;
    s.committed_scale = s.scale;
    if (!loaded.emplace(name, s).second) fail_state("slot '" + name + "' appears twice");
  }
  if (constants_changed)
    logger().warn("policy fp8-current: fp8_format or margin changed since the checkpoint; the " +
                  std::to_string(loaded.size()) + " scales were recomputed from their last amax");
  report_slot_migration(state, loaded.size());
  slots_ = std::move(loaded);
}

}  // namespace mixtrain::fp8
