// Fp8PrecisionPolicy: what fp8-delayed and fp8-current share — the plan, the per-role FP8
// dtypes, the common options and the checks of a saved state.
//
// Contract
// - plan(): ops with GEMMs get gemm_input = fp8_e4m3 (the host asks operand_scaling() for each
//   operand's real dtype and scale) and the base recipe's working weight dtype. Every op stores
//   activations and activation gradients in the base recipe's dtypes. Deterministic; depends on
//   whether the op has GEMMs only. Precision-sensitive ops are pinned to FP32 by the host.
// - Saved states name slots "<node>.<gemm>.<role>" (version 2). A version-1 state's
//   "<layer>.<role>" names are renamed to "<layer>.matmul.<role>" on load (read_slot_name());
//   a version this build does not know is refused with a message that names it.
// - uses_scaled_operands() is true; needs_loss_scaling() is the base recipe's (fp16 base only).
// - adapt_to() throws sdk::BackendError when the backend lists GEMM dtypes but not the FP8 ones
//   the format needs, and logs when FP8 GEMMs are emulated.
// - Options common to both: fp8_format, margin, base (schema in common_option_schema()).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "fp8_recipe.h"
#include "mixtrain/sdk/component_state.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/plugin.h"
#include "mixtrain/sdk/precision_policy.h"

namespace mixtrain::fp8 {

class Fp8PrecisionPolicy : public sdk::PrecisionPolicy {
 public:
  Fp8PrecisionPolicy(std::string component, const sdk::Options& options,
                     const sdk::PluginContext& context);

  static sdk::OptionSchema common_option_schema();

  void adapt_to(const sdk::BackendCapabilities& capabilities) override;
  sdk::OpPrecision plan(const sdk::OpDescription& op) const override;
  bool needs_loss_scaling() const override { return base_->needs_loss_scaling; }
  bool uses_scaled_operands() const override { return true; }

  Fp8Format format() const { return format_; }
  int margin() const { return margin_; }
  const BaseRecipe& base() const { return *base_; }
  const std::string& component() const { return component_; }

 protected:
  const sdk::Logger& logger() const { return logger_; }

  // State checks: each throws sdk::CheckpointError naming this component and the entry.
  void check_state_version(const sdk::ComponentState& state, std::int64_t current) const;
  std::int64_t read_int(const sdk::ComponentState& state, const std::string& key, std::int64_t min,
                        std::int64_t max) const;
  float read_scale(const sdk::ComponentState& state, const std::string& key) const;
  const std::string& read_string(const sdk::ComponentState& state, const std::string& key) const;
  // The slot name saved under `key` in the current form "<node>.<gemm>.<role>" (a version-1
  // name renamed) and its role; throws when the name has neither form.
  std::pair<std::string, sdk::OperandRole> read_slot_name(const sdk::ComponentState& state,
                                                          const std::string& key) const;
  // Logs (info) that a version-1 state's `count` slots were renamed; nothing for version 2.
  void report_slot_migration(const sdk::ComponentState& state, std::size_t count) const;
  [[noreturn]] void fail_state(const std::string& what) const;

  // Logs (info) each saved recipe option that differs from the configured one; returns true when
  // fp8_format or margin differs, i.e. when saved scales were derived for other constants.
  bool report_recipe_changes(const sdk::ComponentState& state) const;
  void save_recipe(sdk::ComponentState& state) const;

 private:
  std::string component_;
  Fp8Format format_;
  int margin_;
  const BaseRecipe* base_;
  sdk::Logger logger_;
};

}  // namespace mixtrain::fp8
