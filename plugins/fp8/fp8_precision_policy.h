// Fp8PrecisionPolicy: what fp8-delayed and fp8-current share — the plan, the per-role FP8
// dtypes, the common options and the checks of a saved state.
//
// Contract
// - plan(): layers on the FP32 deny-list ("layernorm", "softmax_cross_entropy") get every dtype
//   fp32 and fp32_pinned = true. GEMM layers get gemm_input = fp8_e4m3 (the host asks
//   operand_scaling() for each operand's real dtype and scale) and the base recipe's working
//   weight dtype. Every non-pinned layer stores activations and activation gradients in the base
//   recipe's dtypes. Deterministic; depends on the layer's type and has_gemm only.
// - uses_scaled_operands() is true; needs_loss_scaling() is the base recipe's (fp16 base only).
// - adapt_to() throws sdk::BackendError when the backend lists GEMM dtypes but not the FP8 ones
//   the format needs, and logs when FP8 GEMMs are emulated.
// - Options common to both: fp8_format, margin, base (schema in common_option_schema()).
#pragma once

#include <cstdint>
#include <string>

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
  sdk::LayerPrecision plan(const sdk::LayerDescription& layer) const override;
  bool needs_loss_scaling() const override { return base_->needs_loss_scaling; }
  bool uses_scaled_operands() const override { return true; }

  Fp8Format format() const { return format_; }
  int margin() const { return margin_; }
  const BaseRecipe& base() const { return *base_; }
  const std::string& component() const { return component_; }

  static bool is_fp32_pinned(const sdk::LayerDescription& layer);

 protected:
  const sdk::Logger& logger() const { return logger_; }

  // State checks: each throws sdk::CheckpointError naming this component and the entry.
  void check_state_version(const sdk::ComponentState& state, std::int64_t current) const;
  std::int64_t read_int(const sdk::ComponentState& state, const std::string& key,
                        std::int64_t min, std::int64_t max) const;
  float read_scale(const sdk::ComponentState& state, const std::string& key) const;
  const std::string& read_string(const sdk::ComponentState& state, const std::string& key) const;
  // The role a saved slot name ends in; throws when it ends in none.
  sdk::OperandRole read_slot_role(const std::string& key, const std::string& slot) const;
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
