// SkipBlame: what the non-finite replay of a skipped step blames (docs/architecture.md, "One
// training step"). A value: copied, compared, carried between ranks as one text. Internal to the
// core.
//
// Contract
// - tensor: the first non-finite tensor the replay met ("forward fc2.output", "loss", with
//   run.accumulate > 1 "micro-batch 2 of 4: backward fc1.weight.grad"); empty when the replay
//   found every tensor finite.
// - node: the node whose forward or backward wrote it, what automatic escalation promotes; empty
//   for the input batch, the loss, or when nothing was found.
// - in_backward(): the tensor was written by a backward pass (micro-batch prefix aside), where the
//   loss scale multiplies every value.
// - scale_made: set by the step, not carried in the text: a backward overflow that a replay at
//   loss scale 1 does not repeat, so the scale made it and a scaler's back-off fixes it; automatic
//   escalation blames no op for it (docs/precision-autopilot.md, "What counts as a blame").
// - to_text() / from_text(): one text for a host collective (empty when nothing was found), read
//   back to the same value (scale_made false); node names hold no newline.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace mixtrain::core {

struct SkipBlame {
  std::string tensor;
  std::string node;
  bool scale_made = false;

  bool found() const { return !tensor.empty(); }
  bool in_backward() const;
  // The tensor, or "none on replay": what the warning and the stop message print.
  std::string tensor_or_none() const { return found() ? tensor : "none on replay"; }
  // The same blame named within micro-batch `index` (0-based) of `count`; unchanged when nothing
  // was found.
  SkipBlame in_micro_batch(std::int64_t index, std::int64_t count) const;

  std::string to_text() const;
  static SkipBlame from_text(std::string_view text);

  bool operator==(const SkipBlame&) const = default;
};

}  // namespace mixtrain::core
