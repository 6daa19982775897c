// RunPosition: where a training run stands, counted in optimizer steps; saved in checkpoints
// ("progress") and restored by a resume. Internal to the core.
//
// Contract
// - step: the last step run (0 before the first); applied + skipped == step for a run that
//   started at 0 (a resumed run restores all three).
// - resumed_from: the checkpoint file this run resumed from; empty for a fresh run.
// - policy_since, scaler_since, optimizer_since: the run's counters when that component's state
//   began: all 0, or where a resume switched it to another one (--set precision.policy,
//   scaler.type, optimizer.type), since when the new one has counted `step - since.step` steps
//   (`applied - since.applied` applied, `skipped - since.skipped` skipped). Saved with the
//   component's state ("since_step", "since_applied", "since_skipped", each only when not 0), so
//   the run's later resumes check its counters against those differences.
// - complete_on_resume: the checkpoint resumed in place (no other run folder asked for) is already
//   at (or past) run.steps, so the run has nothing to train and writes nothing: not its folder's
//   config, metrics, checkpoints or summary.
#pragma once

#include <cstdint>
#include <filesystem>

namespace mixtrain::core {

// The run's counters at a point: where a component's state began.
struct StateOrigin {
  std::int64_t step = 0, applied = 0, skipped = 0;
};

struct RunPosition {
  std::int64_t step = 0;
  std::int64_t applied = 0;  // steps whose update the optimizer applied
  std::int64_t skipped = 0;  // steps the scaler skipped (non-finite gradients)
  std::filesystem::path resumed_from;
  StateOrigin policy_since, scaler_since, optimizer_since;
  bool complete_on_resume = false;
};

}  // namespace mixtrain::core
