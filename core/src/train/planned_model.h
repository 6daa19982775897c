// The trainer's model under its precision plan, built once at construction and again whenever
// automatic escalation changes the plan (docs/precision-autopilot.md, "Escalation"). Internal to
// the core.
//
// Contract
// - build_model(s): a new Model for the experiment, planned under the policy with the config's
//   [[precision.override]] entries and then the escalation's overrides (which beat them), checked
//   against the backend, allocated, its trainable parameters handed to s.params / s.grads, the
//   optimizer
//   bound (its state zeroed) and the step graph set up. Weights are not initialised.
// - replan_model(s): build_model() for the current plan while keeping the training state: the
//   FP32 masters, the buffers and the optimizer's state go through the host and come back into the
//   new model bit for bit, and the working copies are cast from the masters again (a frozen
//   parameter goes through as FP32 and is stored again in its op's dtype). The new layers get
//   the run's seed (dropout masks, stochastic rounding), as the first build's do. Both the old
//   and the new model are never held at once.
// - escalate_after_step(s, step, outcome): hands the step to the escalation (when enabled); on a
//   promotion or demotion it logs why, records it in the metrics (a record with "escalation"),
//   and replans; a blamed op that is already fp32 is logged once. Returns the event, if any.
#pragma once

#include <optional>

#include "precision/escalation.h"
#include "train/step.h"
#include "train/trainer_state.h"

namespace mixtrain::core {

void build_model(Trainer::State& s);
void replan_model(Trainer::State& s);
std::optional<Escalation::Event> escalate_after_step(Trainer::State& s, std::int64_t step,
                                                     const StepOutcome& outcome);

}  // namespace mixtrain::core
