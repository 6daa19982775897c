// What the run comparison's statistics and its renderings share (internal to the core).
//
// Contract: finite_losses() is the one reading of a run's loss curve that both the loss gap
// (runs/comparison.cpp) and the table's "no common steps" note (runs/comparison_render.cpp) use,
// so the two always agree on which steps a run logged.
#pragma once

#include <cstdint>
#include <map>

#include "mixtrain/core/runs/comparison.h"

namespace mixtrain::core {

// step -> loss, finite losses only; a step logged twice keeps its last record.
std::map<std::int64_t, double> finite_losses(const RunData& run);

}  // namespace mixtrain::core
