// PrecisionState: what the trainer keeps about its precision plan beyond the policy's own state.
// Internal to the core.
//
// Contract
// - escalation ([precision.escalate]): which ops were promoted and the blames counting towards
//   the next promotion; its overrides are part of the plan (train/planned_model.h) and it is
//   saved in checkpoints ("escalation").
// - underflow_watch: some layer of the current plan stores activation gradients in a format of a
//   narrower range than fp32's (fp16, FP8; not bf16, which has fp32's exponent bits), so
//   run.underflow_every steps measure their underflow; set by every build of the model.
#pragma once

#include "precision/escalation.h"

namespace mixtrain::core {

struct PrecisionState {
  Escalation escalation;
  bool underflow_watch = false;
};

}  // namespace mixtrain::core
