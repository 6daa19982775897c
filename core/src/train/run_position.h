// RunPosition: where a training run stands, counted in optimizer steps; saved in checkpoints
// ("progress") and restored by a resume. Internal to the core.
//
// Contract
// - step: the last step run (0 before the first); applied + skipped == step for a run that
//   started at 0 (a resumed run restores all three).
// - resumed_from: the checkpoint file this run resumed from; empty for a fresh run.
// - policy_since_applied: the applied steps before the precision policy's state began: 0, or
//   where a resume switched policies (--set precision.policy), since when the new policy has
//   heard of `applied - policy_since_applied` steps. Saved with the policy's state
//   ("since_applied"), so the run's later resumes check its counter against that difference.
// - complete_on_resume: the checkpoint resumed in place (no other run folder asked for) is already
//   at (or past) run.steps, so the run has nothing to train and writes nothing: not its folder's
//   config, metrics, checkpoints or summary.
#pragma once

#include <cstdint>
#include <filesystem>

namespace mixtrain::core {

struct RunPosition {
  std::int64_t step = 0;
  std::int64_t applied = 0;  // steps whose update the optimizer applied
  std::int64_t skipped = 0;  // steps the scaler skipped (non-finite gradients)
  std::filesystem::path resumed_from;
  std::int64_t policy_since_applied = 0;
  bool complete_on_resume = false;
};

}  // namespace mixtrain::core
