// SettledState: the last step whose end the training state holds whole, which Trainer::run keeps
// track of so that an error between two steps (a damaged file in an evaluation's batch or in the
// next training batch, a plugin or a hook that throws after the update) writes that step's
// checkpoint before the error ends the run, instead of losing every step since the last periodic
// checkpoint (docs/architecture.md, "When a run stops on an error"). Internal to the core.
//
// Contract
// - step: the settled step (the run's first step - 1 before it trains), or kUnsettled from a
//   step's first forward until its update and its precision escalation are made: an error there
//   leaves a state no checkpoint may hold (batch norm's statistics, FP8 amaxes, the scaler or the
//   optimizer half moved), and only the newest checkpoint is named.
// - cursor: the training sampler's cursor at that step's end. An error in the next step before
//   its first forward (its batch's files) leaves the state settled but the step counter and the
//   cursor advanced: keep_settled_state sets both back before it saves.
// - saved: the step of the newest checkpoint this process wrote (-1: none); saving: inside
//   Trainer::save_checkpoint, whose own error already names what the run has to go on from.
// - keep_settled_state never throws: with the original error in flight, a failure of its own is
//   logged (a warning) and the original is what the run ends with. A data-parallel run saves
//   nothing (an error on one rank leaves the others in a collective): it names the newest
//   checkpoint. Nothing is written without a run folder, with checkpoint.final = false, or before
//   the run's first step.
#pragma once

#include <cstdint>

#include "mixtrain/core/data/batch_sampler.h"
#include "mixtrain/core/train/trainer.h"

namespace mixtrain::core {

struct SettledState {
  static constexpr std::int64_t kUnsettled = -1;
  std::int64_t step = kUnsettled;
  BatchSampler::Cursor cursor;
  std::int64_t first_step = 0;  // the step the run started from (a resume's)
  std::int64_t saved = -1;
  bool saving = false;
};

// The state as it stands before the loop's first step.
SettledState settled_at_start(const Trainer::State& s);

// Called from Trainer::run's handler while an error ends the run.
void keep_settled_state(Trainer& trainer, Trainer::State& s, SettledState& settled) noexcept;

}  // namespace mixtrain::core
