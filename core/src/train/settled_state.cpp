#include "train/settled_state.h"

#include <exception>
#include <string>

#include "train/trainer_state.h"

namespace mixtrain::core {

SettledState settled_at_start(const Trainer::State& s) {
  SettledState settled;
  settled.step = s.position.step;
  settled.first_step = s.position.step;
  settled.cursor = s.data.sampler->cursor();
  return settled;
}

namespace {

// "the newest checkpoint this run has is X: continue with ...", or that it has none.
std::string newest_text(const Trainer::State& s, std::int64_t after_step) {
  const auto last = newest_checkpoint_before(s, after_step + 1);
  if (!last) return "this run has no checkpoint to go on from";
  return "the newest checkpoint this run has is " + last->string() + " (continue with " +
         continue_route(s, *last, s.run_dir) + " once it is fixed)";
}

}  // namespace

void keep_settled_state(Trainer& trainer, Trainer::State& s, SettledState& settled) noexcept {
  try {
    // The save's own error says what the run has; a rank that writes nothing (or a run without a
    // folder) has nothing to say.
    if (settled.saving || !s.writes || s.run_dir.empty()) return;
    if (s.reducer->world() > 1) {
      s.log.warn("a data-parallel run writes no checkpoint when an error stops one rank: " +
                 newest_text(s, s.position.step));
      return;
    }
    if (s.step_in_flight) settled.step = SettledState::kUnsettled;
    if (settled.step == SettledState::kUnsettled) {
      s.log.warn("the error below stopped step " + std::to_string(s.position.step) +
                 " partway, so its state is not saved: " + newest_text(s, s.position.step));
      return;
    }
    if (settled.step == settled.first_step || !s.e.checkpoint.write_final) return;
    if (settled.saved == settled.step) {
      s.log.warn("the error below came after the step-" + std::to_string(settled.step) +
                 " checkpoint: " + newest_text(s, settled.step));
      return;
    }
    // An error in the next step's batch, before its forward: the step counter and the sampler
    // moved, nothing else did.
    if (s.position.step != settled.step) {
      s.position.step = settled.step;
      s.data.sampler->set_cursor(settled.cursor);
    }
    settled.saving = true;
    const auto path = trainer.save_checkpoint();
    settled.saving = false;
    settled.saved = settled.step;
    s.log.warn("the error below stopped the run after step " + std::to_string(settled.step) +
               ", whose state is saved in " + path.string() + ": once it is fixed, continue with " +
               continue_route(s, path, s.run_dir));
  } catch (const std::exception& e) {
    try {
      s.log.warn("the state after step " + std::to_string(settled.step) +
                 " could not be saved before the error below ended the run: " + e.what());
    } catch (...) {  // the log's own failure: the original error is what the run ends with
    }
  } catch (...) {
  }
}

}  // namespace mixtrain::core
