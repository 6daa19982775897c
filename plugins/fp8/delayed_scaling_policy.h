// DelayedScalingPolicy (`fp8-delayed`): FP8 GEMM operands scaled from a history of past amaxes,
// Transformer Engine's DelayedScaling recipe.
//
// Contract (see README.md for the options and the host protocol)
// - One ScalingSlot per sdk::OperandSlot (node, GEMM, role), created on first use by
//   operand_scaling() or record_amax(), named "<node>.<gemm>.<role>": an AmaxHistory of
//   amax_history_len entries (all 0), scale 1, scale_inv 1.
// - operand_scaling() returns the slot's dtype (E4M3, or E5M2 for grad_output under "hybrid"),
//   scale and scale_inv; it never changes them within a step.
// - record_amax() folds the amax measured while casting into the slot's entry for this step.
// - on_step_end(true): every `interval` applied steps each slot's scale becomes
//   compute_scale(amax, dtype, margin) with amax = the max over the history ("max") or this
//   step's entry ("most_recent") — a zero, inf or NaN amax keeps the previous scale — and
//   scale_inv = 1 / scale; then the history rolls. amax_update "fused" (the default, Transformer
//   Engine's fused kernel): a slot whose entry for this step is 0 neither rolls nor recomputes,
//   and "max" skips NaN entries. "unfused" (its torch fallback): every slot rolls, and one NaN
//   makes "max" NaN. on_step_end(false): this step's entries are zeroed, nothing else changes.
// - save_state()/load_state(): version 2, the recipe options, applied_steps and per slot its
//   name, ring, position and scale; scale_inv is recomputed on load. A version-1 state (slots
//   "<layer>.<role>") loads with each slot renamed "<layer>.matmul.<role>" and logs that; a newer
//   version is refused with a message naming it. amax_update is not saved:
//   both updates read and write the same ring, so the config's applies on resume. A ring of another
//   length keeps its most recent min(saved, configured) entries (zeros pad the oldest side) and
//   logs a warning. Malformed states throw sdk::CheckpointError and leave the policy unchanged.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "amax_history.h"
#include "fp8_precision_policy.h"

namespace mixtrain::fp8 {

enum class AmaxComputeAlgo { max, most_recent };
enum class AmaxUpdate { fused, unfused };

struct ScalingSlot {
  ScalingSlot(sdk::DType dtype_, AmaxHistory history_, float scale_ = 1.0f)
      : dtype(dtype_), history(std::move(history_)), scale(scale_), scale_inv(1.0f / scale_) {}
  sdk::DType dtype;
  AmaxHistory history;
  float scale;
  float scale_inv;
};

class DelayedScalingPolicy final : public Fp8PrecisionPolicy {
 public:
  static constexpr std::int64_t kStateVersion = 2;  // 2: slots per GEMM
  static constexpr std::int64_t kMaxHistoryLen = std::int64_t{1} << 16;
  static sdk::OptionSchema option_schema();

  DelayedScalingPolicy(const sdk::Options& options, const sdk::PluginContext& context);

  sdk::OperandScaling operand_scaling(const sdk::OperandSlot& slot) override;
  void record_amax(const sdk::OperandSlot& slot, float amax) override;
  void on_step_end(bool applied) override;

  sdk::ComponentState save_state() const override;
  void load_state(const sdk::ComponentState& state) override;

  std::size_t amax_history_len() const { return history_len_; }
  AmaxComputeAlgo amax_compute_algo() const { return algo_; }
  AmaxUpdate amax_update() const { return update_; }
  std::int64_t interval() const { return interval_; }
  std::int64_t applied_steps() const { return applied_steps_; }
  // Inspection for tests and tools; nullptr when the slot does not exist yet.
  const ScalingSlot* slot(std::string_view name) const;
  std::vector<std::string> slot_names() const;

 private:
  ScalingSlot& slot_for(const sdk::OperandSlot& slot);
  float history_amax(const AmaxHistory& history) const;
  void warn_non_finite(const std::string& name, const ScalingSlot& slot) const;
  void set_scale(const std::string& name, ScalingSlot& slot, float amax, float new_scale) const;

  std::size_t history_len_;
  AmaxComputeAlgo algo_;
  AmaxUpdate update_;
  std::int64_t interval_;
  std::int64_t applied_steps_ = 0;
  std::map<std::string, ScalingSlot, std::less<>> slots_;
};

}  // namespace mixtrain::fp8
