// The learning-rate schedule's keys of [optimizer] (schedule, warmup_steps, min_lr, step_size,
// gamma, milestones, pct_start, div_factor, final_div_factor, clip_grad_norm): read into
// Experiment::schedule and checked together. Read after [run] (run.steps) and the optimizer's
// own options (e.optimizer_options: its lr). Internal to the core.
//
// Contract
// - Each key's own range is the schema's (schedule_schema()); here the keys are checked against
//   each other and the run, as sdk::ConfigError at the key's file:line:col: multistep's
//   milestones non-empty, each >= 1 and strictly increasing; onecycle's pct_start < 1 with a
//   rising phase of more than one step, and no warmup_steps or min_lr (its own counterparts
//   replace them); inverse_sqrt's warmup_steps >= 1; warmup_cosine's and linear's min_lr not
//   above the optimizer's lr (where the optimizer declares one).
// - Valid values that are more likely slips go to Experiment::config_warnings, naming the key: a
//   milestone beyond run.steps, a warm-up that does not end before run.steps, gamma > 1, onecycle
//   divisors that start or end above lr. Schedule keys given away from their defaults that the
//   chosen schedule does not read go to Experiment::unused_keys.
#pragma once

#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain::core {

void read_schedule(const Config& config, const sdk::Options& optimizer, Experiment& e);

}  // namespace mixtrain::core
