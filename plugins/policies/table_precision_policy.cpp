#include "table_precision_policy.h"

#include <string>

namespace mixtrain::policies {

TablePrecisionPolicy::TablePrecisionPolicy(const PolicyRecipe& recipe,
                                           const sdk::PluginContext& context)
    : recipe_(&recipe), logger_(context.logger) {
  logger_.debug("precision policy " + std::string(recipe_->name) + ": weights " +
                std::string(sdk::dtype_name(recipe_->weight)) + ", gemm inputs " +
                std::string(sdk::dtype_name(recipe_->gemm_input)) + ", activations " +
                std::string(sdk::dtype_name(recipe_->activation)));
}

sdk::OpPrecision TablePrecisionPolicy::plan(const sdk::OpDescription& op) const {
  sdk::OpPrecision p;  // all fp32
  if (op.has_gemm()) {
    p.weight = recipe_->weight;
    p.gemm_input = recipe_->gemm_input;
  }
  p.activation = recipe_->activation;
  p.activation_grad = recipe_->activation_grad;
  return p;
}

AutoPrecisionPolicy::AutoPrecisionPolicy(const sdk::Options& /*options*/,
                                         const sdk::PluginContext& context)
    : TablePrecisionPolicy(kFp16MixedRecipe, context) {}

void AutoPrecisionPolicy::adapt_to(const sdk::BackendCapabilities& capabilities) {
  const bool bf16_native = capabilities.native(sdk::DType::bf16);
  const bool fp16_native = capabilities.native(sdk::DType::fp16);
  std::string why;
  if (bf16_native) {
    select(kBf16MixedRecipe);
    why = "runs bf16 GEMMs natively";
  } else if (fp16_native) {
    select(kFp16MixedRecipe);
    why = "runs fp16 GEMMs natively but not bf16";
  } else {
    // Emulated 16-bit formats cost time and buy nothing but their rounding: a user studying that
    // numerics names the policy instead.
    select(kFp32Recipe);
    why =
        "runs no 16-bit GEMM natively (bf16 and fp16 would be emulated); name a policy, e.g. "
        "bf16-mixed, to study its numerics under emulation";
  }
  logger().info("auto policy chose " + std::string(recipe().name) + ": the " + capabilities.kind +
                " backend " + why);
}

}  // namespace mixtrain::policies
