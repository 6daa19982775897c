// TablePrecisionPolicy: a precision policy defined entirely by a PolicyRecipe.
//
// Contract: plan() is deterministic and depends only on whether the op has GEMMs:
// - ops with GEMMs get the recipe's weight and gemm_input dtypes; other ops keep fp32 there;
// - every op stores activations and activation gradients in the recipe's dtypes.
// Precision-sensitive ops (layernorm statistics, softmax, loss) are pinned to FP32 by the host
// from the op's own trait, after plan(); this policy keeps no deny-list.
// needs_loss_scaling() is the recipe's flag. No options, no state across steps.
// RecipePolicy<R> binds a recipe at compile time so sdk::make_component can build it.
#pragma once

#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/plugin.h"
#include "mixtrain/sdk/precision_policy.h"
#include "policy_recipes.h"

namespace mixtrain::policies {

class TablePrecisionPolicy : public sdk::PrecisionPolicy {
 public:
  TablePrecisionPolicy(const PolicyRecipe& recipe, const sdk::PluginContext& context);

  sdk::OpPrecision plan(const sdk::OpDescription& op) const override;
  bool needs_loss_scaling() const override { return recipe_->needs_loss_scaling; }
  const PolicyRecipe& recipe() const { return *recipe_; }

 protected:
  void select(const PolicyRecipe& recipe) { recipe_ = &recipe; }
  const sdk::Logger& logger() const { return logger_; }

 private:
  const PolicyRecipe* recipe_;
  sdk::Logger logger_;
};

// `auto`: bf16-mixed where the backend runs bf16 GEMMs natively; else fp16-mixed where it runs
// fp16 natively (the host's check warns when no loss scaler is configured); else fp32, since an
// emulated 16-bit format only costs time (emulation is for studying numerics, asked for by name).
// Logs one info line with the choice and the reason.
class AutoPrecisionPolicy final : public TablePrecisionPolicy {
 public:
  static sdk::OptionSchema option_schema() { return {}; }
  AutoPrecisionPolicy(const sdk::Options& options, const sdk::PluginContext& context);
  void adapt_to(const sdk::BackendCapabilities& capabilities) override;
  std::string resolved_name() const override { return std::string(recipe().name); }
};

template <const PolicyRecipe& Recipe>
class RecipePolicy final : public TablePrecisionPolicy {
 public:
  static sdk::OptionSchema option_schema() { return {}; }
  RecipePolicy(const sdk::Options& /*options*/, const sdk::PluginContext& context)
      : TablePrecisionPolicy(Recipe, context) {}
};

using Fp32Policy = RecipePolicy<kFp32Recipe>;
using Tf32Policy = RecipePolicy<kTf32Recipe>;
using Fp16MixedPolicy = RecipePolicy<kFp16MixedRecipe>;
using Bf16MixedPolicy = RecipePolicy<kBf16MixedRecipe>;

}  // namespace mixtrain::policies
