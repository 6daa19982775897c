#include "mixtrain/core/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mixtrain::core {

namespace {

// torch.optim.lr_scheduler.OneCycleLR._annealing_cos, operation for operation, so the parity
// test holds to rounding.
double annealing_cos(double start, double end, double pct) {
  const double cos_out = std::cos(std::numbers::pi * pct) + 1.0;
  return end + (start - end) / 2.0 * cos_out;
}

// OneCycleLR.get_lr with three_phase = False: phase one ends at pct_start · total - 1, phase two
// at total - 1; each anneals from its start to its end rate over (step - start) / (end - start).
double one_cycle(const LrSchedule& s, std::int64_t k) {
  const double initial = s.base_lr / s.div_factor;
  const double floor = initial / s.final_div_factor;
  const double end_one = s.pct_start * static_cast<double>(s.total_steps) - 1.0;
  const double end_two = static_cast<double>(s.total_steps) - 1.0;
  const double step = static_cast<double>(k);
  if (step <= end_one) return annealing_cos(initial, s.base_lr, step / end_one);
  // Past the last step (a run resumed with a larger run.steps) the rate stays at the floor
  // instead of rising again along the cosine.
  const double pct = std::min(1.0, (step - end_one) / (end_two - end_one));
  return annealing_cos(s.base_lr, floor, pct);
}

}  // namespace

const std::vector<std::string>& lr_schedule_kinds() {
  static const std::vector<std::string> kinds = choice_names(kLrScheduleKinds);
  return kinds;
}

std::string lr_schedule_name(LrScheduleKind kind) {
  return std::string(choice_name(kind, kLrScheduleKinds));
}

bool lr_schedule_has_horizon(LrScheduleKind kind) {
  return kind == LrScheduleKind::warmup_cosine || kind == LrScheduleKind::linear ||
         kind == LrScheduleKind::onecycle;
}

double LrSchedule::lr_at(std::int64_t applied) const {
  if (kind == LrScheduleKind::constant) return base_lr;
  if (kind == LrScheduleKind::onecycle) return one_cycle(*this, applied);
  if (kind == LrScheduleKind::inverse_sqrt) {
    const double n = static_cast<double>(applied + 1), w = static_cast<double>(warmup_steps);
    return n <= w ? base_lr * n / w : base_lr * std::sqrt(w / n);
  }
  if (warmup_steps > 0 && applied < warmup_steps)
    return base_lr * static_cast<double>(applied + 1) / static_cast<double>(warmup_steps);
  const std::int64_t t = applied - warmup_steps;  // the schedule's own clock starts after warm-up
  if (kind == LrScheduleKind::step)
    return base_lr * std::pow(gamma, static_cast<double>(t / std::max<std::int64_t>(1, step_size)));
  if (kind == LrScheduleKind::multistep) {
    const auto passed =
        std::upper_bound(milestones.begin(), milestones.end(), t) - milestones.begin();
    return base_lr * std::pow(gamma, static_cast<double>(passed));
  }
  const double span = static_cast<double>(std::max<std::int64_t>(1, total_steps - warmup_steps));
  const double frac = std::clamp(static_cast<double>(t) / span, 0.0, 1.0);
  if (kind == LrScheduleKind::linear) return base_lr + (min_lr - base_lr) * frac;
  return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * frac));
}

}  // namespace mixtrain::core
