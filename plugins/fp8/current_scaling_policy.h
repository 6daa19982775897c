// CurrentScalingPolicy (`fp8-current`): FP8 GEMM operands scaled from the amax of the tensor
// being cast, as close to Transformer Engine's Float8CurrentScaling as the SDK's call order
// allows.
//
// Contract (see README.md, "Current scaling and the host protocol")
// - One CurrentScalingSlot per sdk::OperandSlot (node, GEMM, role), created on first use, named
//   "<node>.<gemm>.<role>": scale 1, scale_inv 1, amax 0.
// - record_amax() sets the slot's amax to the observation (the latest one wins, no max) and, when
//   it is positive and finite, its scale to compute_scale(amax, dtype, margin) at once.
// - operand_scaling() returns the scale of the latest recorded amax: the tensor's own amax when
//   the host recorded it before asking (true current scaling), otherwise the amax of the previous
//   cast of this slot (one cast late, as delayed scaling with a history of 1).
// - on_step_end(true) commits the slots; on_step_end(false) restores every slot to its value at
//   the last applied step, so a skipped step leaves no trace.
// - save_state()/load_state(): version 2, the recipe options and per slot its name, amax and
//   scale; scale_inv is recomputed on load. A version-1 state (slots "<layer>.<role>") loads with
//   each slot renamed "<layer>.matmul.<role>" and logs that; a newer version is refused with a
//   message naming it. Malformed states throw sdk::CheckpointError and
//   leave the policy unchanged.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fp8_precision_policy.h"

namespace mixtrain::fp8 {

struct CurrentScalingSlot {
  sdk::DType dtype = sdk::DType::fp8_e4m3;
  float amax = 0.0f;
  float scale = 1.0f;
  float scale_inv = 1.0f;
  // The values at the last applied step, restored when a step is skipped.
  float committed_amax = 0.0f;
  float committed_scale = 1.0f;
};

class CurrentScalingPolicy final : public Fp8PrecisionPolicy {
 public:
  static constexpr std::int64_t kStateVersion = 2;  // 2: slots per GEMM
  static sdk::OptionSchema option_schema() { return common_option_schema(); }

  CurrentScalingPolicy(const sdk::Options& options, const sdk::PluginContext& context);

  // The host measures each operand's amax and records it before asking for its scale.
  bool wants_current_amax() const override { return true; }
  sdk::OperandScaling operand_scaling(const sdk::OperandSlot& slot) override;
  void record_amax(const sdk::OperandSlot& slot, float amax) override;
  void on_step_end(bool applied) override;

  sdk::ComponentState save_state() const override;
  void load_state(const sdk::ComponentState& state) override;

  const CurrentScalingSlot* slot(std::string_view name) const;
  std::vector<std::string> slot_names() const;

 private:
  CurrentScalingSlot& slot_for(const sdk::OperandSlot& slot);

  std::map<std::string, CurrentScalingSlot, std::less<>> slots_;
};

}  // namespace mixtrain::fp8
