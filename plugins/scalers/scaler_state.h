// Helpers shared by the loss scalers: reading and checking their ComponentState, counting steps
// without overflow, and printing scales in log lines.
//
// Contract: every reader throws sdk::CheckpointError naming the component, the entry and the
// offending value when an entry is missing, mistyped or out of its valid range, so a damaged
// checkpoint never silently yields a wrong scale trajectory.
#pragma once

#include <cstdint>
#include <string>

#include "mixtrain/sdk/component_state.h"

namespace mixtrain::scalers {

// Rejects states written by a newer version of `component` than this build understands.
void check_state_version(const sdk::ComponentState& state, const std::string& component,
                         std::int64_t current_version);

// An integer entry in [min, max].
std::int64_t read_state_int(const sdk::ComponentState& state, const std::string& component,
                            const std::string& key, std::int64_t min, std::int64_t max);

// A finite, strictly positive scale that fits in a float.
float read_state_scale(const sdk::ComponentState& state, const std::string& component,
                       const std::string& key);

// ++counter, stopping at INT64_MAX: a step count restored from a checkpoint may already be
// near the top, and a count that stops is harmless where an overflow is undefined behaviour.
inline void count_up(std::int64_t& counter) {
  if (counter < INT64_MAX) ++counter;
}

// "65536", "0.5", "1.5e+10": short, exact enough for log lines.
std::string format_scale(double scale);

}  // namespace mixtrain::scalers
