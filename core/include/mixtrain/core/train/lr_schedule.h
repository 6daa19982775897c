// Learning-rate schedules. The schedule advances on applied optimizer steps only: a step the
// loss scaler skipped does not move the learning rate (Accelerate's rule; a plain PyTorch loop
// steps its scheduler on skipped steps too). total_steps stays run.steps, so skipped steps cut the
// end of the schedule short (README, "Learning-rate schedules").
//
// Contract
// - lr_at(k) is the learning rate of the optimizer step that follows k earlier applied steps
//   (k = 0 is the first step); it is a pure function of k and the fields, so a resumed run gets
//   the same rates from the restored applied-step count.
// - Warm-up (warmup_steps = W > 0; every kind but constant and onecycle): steps k < W take
//   base_lr · (k + 1) / W, reaching base_lr at k = W - 1 (torch's LinearLR with start_factor
//   1/W and total_iters W - 1). The kind then starts its own clock where warm-up ends, at
//   t = k - W, over the remaining total_steps - W steps: torchvision's
//   SequentialLR([warm-up, schedule], milestones=[W]). Step sizes and milestones count from there.
// - inverse_sqrt is one formula with its warm-up: with n = k + 1, base_lr · min(n / W,
//   sqrt(W / n)) (Noam's schedule; fairseq's inverse_sqrt runs it one step later, counting the
//   updates already made); it needs W >= 1.
// - onecycle is torch's OneCycleLR (cosine annealing, two phases, max_lr = base_lr) over
//   total_steps; it warms up itself over pct_start · total_steps steps and ignores warmup_steps
//   and min_lr.
// - The fields are trusted: the config reader (config/experiment.cpp) validates them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mixtrain/core/config/choices.h"
#include "mixtrain/core/config/host_schemas.h"

namespace mixtrain::core {

enum class LrScheduleKind {
  constant,
  warmup_cosine,
  linear,
  step,
  multistep,
  onecycle,
  inverse_sqrt
};
// The schedules lr_at knows with their config names (optimizer.schedule), in the order the docs
// list them.
inline constexpr ChoiceTable<LrScheduleKind, 7> kLrScheduleKinds{
    {{"constant", LrScheduleKind::constant},
     {"warmup_cosine", LrScheduleKind::warmup_cosine},
     {"linear", LrScheduleKind::linear},
     {"step", LrScheduleKind::step},
     {"multistep", LrScheduleKind::multistep},
     {"onecycle", LrScheduleKind::onecycle},
     {"inverse_sqrt", LrScheduleKind::inverse_sqrt}}};

struct LrSchedule {
  // The defaults of the keys optimizer.schedule reads are the schema's (host_schemas.h).
  LrScheduleKind kind = schema_default_choice(schedule_schema(), "schedule", kLrScheduleKinds);
  double base_lr = 1e-3;
  // warmup_cosine, linear: the rate the decay ends at.
  double min_lr = schema_default_number(schedule_schema(), "min_lr");
  std::int64_t warmup_steps = schema_default_int(schedule_schema(), "warmup_steps");
  std::int64_t total_steps = 1;
  // step: base_lr · gamma^floor(t / step_size); multistep: base_lr · gamma^(milestones <= t).
  std::int64_t step_size = schema_default_int(schedule_schema(), "step_size");
  double gamma = schema_default_number(schedule_schema(), "gamma");
  std::vector<std::int64_t> milestones = {};  // strictly increasing, >= 1
  // onecycle: from base_lr / div_factor up to base_lr over pct_start · total_steps steps, then
  // down to base_lr / (div_factor · final_div_factor) at the last step.
  double pct_start = schema_default_number(schedule_schema(), "pct_start");
  double div_factor = schema_default_number(schedule_schema(), "div_factor");
  double final_div_factor = schema_default_number(schedule_schema(), "final_div_factor");

  // lr for the optimizer step that follows `applied_steps` earlier applied steps (0-based).
  double lr_at(std::int64_t applied_steps) const;
};

// Whether lr_at depends on total_steps (warmup_cosine, linear and onecycle end at the last step);
// the others decay by step counts alone.
bool lr_schedule_has_horizon(LrScheduleKind kind);

// The names of kLrScheduleKinds, in its order.
const std::vector<std::string>& lr_schedule_kinds();
std::string lr_schedule_name(LrScheduleKind kind);  // as optimizer.schedule spells it

}  // namespace mixtrain::core
