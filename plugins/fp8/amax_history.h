// AmaxHistory: the ring of per-step amaxes of one FP8 scaling slot (Transformer Engine's
// amax_history, one column).
//
// Contract
// - A ring of `length` floats, all 0 at first, and a position: the entry of the step in
//   progress. record() folds an observation into that entry with a NaN-aware max (a layer may
//   cast the same operand twice in one step, e.g. the input in forward and in backward).
// - roll() ends a step: the position advances and the entry it now points at — the oldest one —
//   is zeroed for the next step. Transformer Engine rolls once per step the same way
//   (torch.roll(history, -1) then history[0] = 0), so the ring always holds the step in
//   progress plus the length-1 completed steps before it.
// - discard_current() zeroes the step in progress (a skipped step leaves no trace).
// - max() is NaN-aware: one NaN entry makes it NaN (torch.max semantics, Transformer Engine's
//   unfused update). max_ignoring_nan() skips NaN entries (fmaxf semantics, Transformer Engine's
//   fused kernel); an inf entry makes both inf. Callers treat a zero or non-finite amax as "keep
//   the previous scale".
// - last_completed(): the entry of the last step rolled (the one before the step in progress);
//   0 for a ring of one entry, whose roll zeroed it.
// - chronological() lists the entries oldest first, the step in progress last;
//   resized() keeps the most recent min(old, new) of them and pads the oldest side with zeros.
#pragma once

#include <cstddef>
#include <vector>

namespace mixtrain::fp8 {

class AmaxHistory {
 public:
  explicit AmaxHistory(std::size_t length);
  // From a saved ring; throws std::invalid_argument when position is outside the ring or the
  // ring is empty.
  AmaxHistory(std::vector<float> ring, std::size_t position);

  void record(float amax);
  float current() const { return ring_[position_]; }
  float last_completed() const {
    return ring_.size() < 2 ? 0.0f : ring_[(position_ + ring_.size() - 1) % ring_.size()];
  }
  float max() const;
  float max_ignoring_nan() const;
  void roll();
  void discard_current() { ring_[position_] = 0.0f; }

  std::size_t length() const { return ring_.size(); }
  std::size_t position() const { return position_; }
  const std::vector<float>& ring() const { return ring_; }
  std::vector<float> chronological() const;
  AmaxHistory resized(std::size_t length) const;

 private:
  std::vector<float> ring_;
  std::size_t position_ = 0;
};

// NaN-aware max of two amaxes: NaN wins, then the larger.
float amax_max(float a, float b);

}  // namespace mixtrain::fp8
