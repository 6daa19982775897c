// One training step, top to bottom (docs/architecture.md, "One training step"). Internal to the
// core.
//
//   for each of run.accumulate micro-batches: batch (host) -> device; forward under the policy's
//   plan; loss in FP32, its backward seed multiplied by loss scale / accumulate (the step's loss
//   is the micro-batches' mean); backward, adding into the FP32 parameter gradients. Then, once
//   per optimizer step as GradScaler prescribes: one fused unscale + non-finite check (with Σg²
//   when clipping or logging needs the norm); clip after the unscale; then either the optimizer
//   step on the FP32 masters and the EMA update, or a skip that names the first non-finite
//   tensor; the scaler and the policy hear the outcome once.
//   Where s.gated_optimizer is set (one process, no FP8 scales, a backend and an optimizer with
//   the gated update), the check is queued and the update queued behind it, gated on the device
//   by the check's status, and the host reads the status while the update runs: no wait drains
//   the device. Otherwise the host waits for the check, then updates. Both give the same bits.
//
// The replicas (s.reducer; distributed/reducer.h) are called at fixed points, in this order,
// whether or not there are others: begin_step before the first micro-batch, the gradient-ready
// hook during backward, finish_gradients before the unscale (which folds in 1 / world),
// flush_operand_amaxes and reduce_totals after it, local_only around a skipped step's replay and
// agree_on_blame after it, after_update after an applied update. Each rank computes its
// rank_batch rows of every global batch (rows [rank · rank_batch, (rank + 1) · rank_batch)).
//
// The step writes its statistics records (gradient underflow, FP8 operands) to s.metrics when
// the request asks; the step's own record is the caller's (it knows the window's throughput).
// s.step_in_flight is true from the first forward until the update or the skip is made: an error
// before it (the first batch's files) leaves the previous step's state whole, one during it does
// not (train/settled_state.h).
#pragma once

#include <functional>
#include <limits>
#include <string_view>

#include "mixtrain/core/graph/diagnostics.h"
#include "train/skip_blame.h"
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
  SkipBlame blame;         // skipped: what the replay found first (the same on every rank)
  bool loss_read = false;  // `loss` is this step's (else the last value read)
  // A skipped step whose weights themselves are not finite: the first such parameter (the same on
  // every rank). No loss scale recovers them, so the run stops (trainer.cpp). Empty otherwise.
  std::string nonfinite_weights;
};

StepOutcome run_training_step(Trainer::State& s, const StepRequest& request);

// Reads the loss of the step just run when it did not (nobody asked for it then): a run that
// learns after the step that this step is its last reports it. Before anything else runs the
// model (an evaluation overwrites the loss buffer).
void read_loss_after_step(Trainer::State& s, StepOutcome& step);

// Every path a step may take, each once whatever the data decides, for the memory rehearsal
// (Trainer::memory_report): one micro-batch's forward and backward (watched node by node by
// s.opt.observer; with a statistics step's FP8 operand diagnostics when the policy scales
// operands), the underflow measurement when run.underflow_every asks for one at a step the run
// reaches (s.position.step, the first, to run.steps), the gradient
// check with the norm, a skipped step's checked replay (on the step's own weights), and the
// update (on zeros where the gradients are not finite: an optimizer steps only on finite ones);
// after(path) is called after each. It writes no records and tells the scaler nothing; the
// weights, the optimizer state and the data position move on as after an applied step. Returns
// the replay's first non-finite tensor of that batch (where is empty when every tensor is
// finite).
NonfiniteSite run_each_step_path(Trainer::State& s,
                                 const std::function<void(std::string_view)>& after);

}  // namespace mixtrain::core
