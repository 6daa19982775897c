// One training step, top to bottom (docs/architecture.md, "One training step"). Internal to the
// core.
//
//   for each of run.accumulate micro-batches: batch (host) -> device; forward under the policy's
//   plan; loss in FP32, its backward seed multiplied by loss scale / accumulate (the step's loss
//   is the micro-batches' mean); backward, adding into the FP32 parameter gradients. Then, once
//   per optimizer step as GradScaler prescribes: one fused unscale + non-finite check (with Σg²
//   in the same wait when clipping or logging needs the norm); clip after the unscale; then either
//   the optimizer step on the FP32 masters and the EMA update, or a skip that names the first
//   non-finite tensor; the scaler and the policy hear the outcome once.
//
// Data parallel (s.dp; docs/architecture.md, "Data parallel"): each rank computes its share of
// the global batch, the gradient buckets are reduced (started during backward by the
// gradient-ready hook) before the unscale, which folds in 1/N; found_inf, Σg² and the loss are
// reduced over the ranks in one host all-reduce (so the loss is read every step), FP8 amaxes are
// MAX-reduced, and a sharded optimizer's updated masters are all-gathered after the update. A
// skipped step's replay names the lowest rank's first non-finite tensor on every rank.
//
// The step writes its statistics records (gradient underflow, FP8 operands) to s.metrics when
// the request asks; the step's own record is the caller's (it knows the window's throughput).
#pragma once

#include <limits>
#include <string>

#include "train/trainer_state.h"

namespace mixtrain::core {

struct StepRequest {
  bool wants_norm = false;  // clipping or the logged gradient norm needs Σg²
  bool statistics = false;  // a run.underflow_every step: underflow and FP8 operand records
  bool read_loss = false;   // the loss is reported or kept (a skipped step reads it anyway)
};

struct StepOutcome {
  sdk::ScalerDecision decision;
  LossValues loss;  // read this step when asked or skipped; else the last value read
  double lr = 0.0;
  double grad_norm = std::numeric_limits<double>::quiet_NaN();  // when wants_norm and applied
  std::string first_nonfinite;  // skipped: the first non-finite tensor on replay
  std::string blamed_node;      // skipped: the node that wrote it (empty: batch, loss, none)
};

StepOutcome run_training_step(Trainer::State& s, const StepRequest& request);

}  // namespace mixtrain::core
