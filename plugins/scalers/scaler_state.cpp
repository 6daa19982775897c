#include "scaler_state.h"

#include <cfloat>
#include <cmath>
#include <cstdio>

#include "mixtrain/sdk/error.h"

namespace mixtrain::scalers {

namespace {
const char* kDamagedHint =
    "the checkpoint is damaged or was written by another scaler; resume from another checkpoint "
    "or start the run without it";
}

void check_state_version(const sdk::ComponentState& state, const std::string& component,
                         std::int64_t current_version) {
  if (state.version < 1 || state.version > current_version)
    throw sdk::CheckpointError("scaler '" + component + "' state has version " +
                                   std::to_string(state.version) + ", this build reads 1.." +
                                   std::to_string(current_version),
                               "resume with the mixtrain version that wrote the checkpoint");
}

std::int64_t read_state_int(const sdk::ComponentState& state, const std::string& component,
                            const std::string& key, std::int64_t min, std::int64_t max) {
  const auto value = state.get<std::int64_t>(key);
  if (value < min || value > max)
    throw sdk::CheckpointError("scaler '" + component + "' state entry '" + key +
                                   "' = " + std::to_string(value) + " is outside [" +
                                   std::to_string(min) + ", " + std::to_string(max) + "]",
                               kDamagedHint);
  return value;
}

float read_state_scale(const sdk::ComponentState& state, const std::string& component,
                       const std::string& key) {
  const auto value = state.get<double>(key);
  if (!std::isfinite(value) || value <= 0.0 || value > FLT_MAX)
    throw sdk::CheckpointError("scaler '" + component + "' state entry '" + key +
                                   "' = " + format_scale(value) + " is not a positive finite float",
                               kDamagedHint);
  return static_cast<float>(value);
}

std::string format_scale(double scale) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", scale);
  return buf;
}

}  // namespace mixtrain::scalers
