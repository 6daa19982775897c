#include "block_scaled_policy.h"

#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/block_scaling.h"

namespace mixtrain::block_scaling {

using sdk::BlockElement;
using sdk::DType;
using sdk::OptionSpec;

sdk::OptionSchema BlockScaledPolicy::option_schema(Recipe recipe) {
  sdk::OptionSchema schema{
      OptionSpec::string("base", "bf16-mixed",
                         "recipe of the parts outside the block-scaled GEMMs: working weights, "
                         "activations and their gradients")
          .one_of({"bf16-mixed", "fp32"}),
  };
  switch (recipe) {
    case Recipe::fp8_block:
      // Transformer Engine's Float8BlockScaling default (NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1
      // is its opt-out).
      schema.push_back(OptionSpec::boolean("power_of_two_scales", true,
                                           "round each block's scale down to a power of two"));
      break;
    case Recipe::mxfp8:
      schema.push_back(
          OptionSpec::string("fp8_format", "e4m3",
                             "e4m3: E4M3 for every operand; hybrid: E5M2 for the gradients")
              .one_of({"e4m3", "hybrid"}));
      schema.push_back(OptionSpec::string("scale_rule", "round_up",
                                          "E8M0 scale: round_up (Transformer Engine: the smallest "
                                          "power of two that saturates nothing) or ocp (the MX "
                                          "spec's floor(log2 amax) - emax)")
                           .one_of({"round_up", "ocp"}));
      break;
    case Recipe::nvfp4:
      schema.push_back(OptionSpec::boolean(
          "stochastic_rounding", true,
          "round the gradients' E2M1 elements stochastically (bits from the run's seed)"));
      // On by default, as in Transformer Engine's NVFP4BlockScaling (NVTE_NVFP4_DISABLE_RHT=1 is
      // its opt-out).
      schema.push_back(OptionSpec::boolean(
          "random_hadamard_transform", true,
          "multiply the wgrad GEMM's inputs by a random 16x16 Hadamard transform along the batch "
          "before quantizing them (spreads outliers; the product is unchanged)"));
      break;
  }
  return schema;
}

BlockScaledPolicy::BlockScaledPolicy(Recipe recipe, const sdk::Options& options,
                                     const sdk::PluginContext& context)
    : recipe_(recipe), bf16_base_(options.get_string("base") == "bf16-mixed") {
  (void)context;
  switch (recipe) {
    case Recipe::fp8_block:
      power_of_two_scales_ = options.get_bool("power_of_two_scales");
      break;
    case Recipe::mxfp8:
      e5m2_gradients_ = options.get_string("fp8_format") == "hybrid";
      ocp_scale_rule_ = options.get_string("scale_rule") == "ocp";
      break;
    case Recipe::nvfp4:
      stochastic_rounding_ = options.get_bool("stochastic_rounding");
      random_hadamard_ = options.get_bool("random_hadamard_transform");
      break;
  }
}

sdk::OpPrecision BlockScaledPolicy::plan(const sdk::OpDescription& op) const {
  const DType base = bf16_base_ ? DType::bf16 : DType::fp32;
  sdk::OpPrecision p;
  if (op.has_gemm()) {
    p.weight = base;
    p.gemm_input = op.has_weight_gemm() ? DType::fp8_e4m3 : base;
  }
  p.activation = base;
  p.activation_grad = base;
  return p;
}

bool BlockScaledPolicy::random_hadamard_transform(const sdk::OperandSlot& /*gemm*/) const {
  return random_hadamard_;
}

sdk::BlockScaledOperandPlan BlockScaledPolicy::operand_plan(const sdk::OperandSlot& slot,
                                                            sdk::GemmPass pass,
                                                            sdk::ReductionAxis axis) const {
  (void)pass;
  const bool weight = slot.role() == sdk::OperandRole::weight;
  const bool gradient = slot.role() == sdk::OperandRole::grad_output;
  sdk::BlockScaledOperandPlan plan;
  switch (recipe_) {
    case Recipe::fp8_block:
      plan.layout = weight ? sdk::fp8_block_weight_layout(BlockElement::e4m3, power_of_two_scales_)
                           : sdk::fp8_block_layout(axis, BlockElement::e4m3, power_of_two_scales_);
      break;
    case Recipe::mxfp8:
      plan.layout = sdk::mx_layout(
          axis, gradient && e5m2_gradients_ ? BlockElement::e5m2 : BlockElement::e4m3,
          ocp_scale_rule_ ? sdk::MxScaleRule::ocp : sdk::MxScaleRule::round_up);
      break;
    case Recipe::nvfp4:
      plan.layout = weight ? sdk::nvfp4_weight_layout() : sdk::nvfp4_layout(axis);
      plan.stochastic_rounding = gradient && stochastic_rounding_;
      break;
  }
  return plan;
}

}  // namespace mixtrain::block_scaling
