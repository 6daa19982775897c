#include "mixtrain/core/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mixtrain::core {

double LrSchedule::lr_at(std::int64_t applied) const {
  if (kind == "constant") return base_lr;
  if (warmup_steps > 0 && applied < warmup_steps)
    return base_lr * static_cast<double>(applied + 1) / static_cast<double>(warmup_steps);
  const double span = static_cast<double>(std::max<std::int64_t>(1, total_steps - warmup_steps));
  const double t = std::clamp(static_cast<double>(applied - warmup_steps) / span, 0.0, 1.0);
  return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
}

}  // namespace mixtrain::core
