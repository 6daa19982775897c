// BlockScaledPolicy: the block-scaled precision policies, one recipe each (Transformer Engine's
// names and options):
//   fp8-block  E4M3 elements, fp32 block scales: 1×128 activations and gradients, 128×128
//              weights; power_of_two_scales rounds each scale down to a power of two.
//   mxfp8      E4M3 elements (fp8_format = "hybrid": E5M2 gradients), one E8M0 scale per 1×32
//              block along the reduction dim; scale_rule "round_up" (TE's: nothing saturates) or
//              "ocp" (the MX spec's floor rule).
//   nvfp4      E2M1 elements, E4M3 block scales (16×16 weights, 1×16 activations and gradients)
//              and an fp32 per-tensor scale, round to nearest even; stochastic_rounding rounds the
//              gradients' elements stochastically (bits keyed by the run's seed: resume-exact);
//              random_hadamard_transform multiplies the wgrad GEMM's inputs by a random 16×16
//              Hadamard transform along the batch first (policy_block_scaling.h 1.1).
//
// Contract
// - plan(): ops with a weight GEMM get gemm_input = fp8_e4m3, the mark by which the host routes
//   their GEMMs through block-scaled operands (policy_block_scaling.h); products of two
//   activations keep the base's dtype; weights, activations and their gradients are the base's
//   (bf16-mixed or fp32). Deterministic.
// - operand_plan(): the recipe's layout for the slot's role, its 1-D blocks along `axis`.
// - Stateless (no amax history): save_state() is empty. No loss scaling is needed.
// - Options out of range are refused by the schema, at their config location.
#pragma once

#include <string>

#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/plugin.h"
#include "mixtrain/sdk/policy_block_scaling.h"
#include "mixtrain/sdk/precision_policy.h"

namespace mixtrain::block_scaling {

enum class Recipe { fp8_block, mxfp8, nvfp4 };

class BlockScaledPolicy : public sdk::PrecisionPolicy, public sdk::BlockScalingFacet {
 public:
  BlockScaledPolicy(Recipe recipe, const sdk::Options& options, const sdk::PluginContext& context);

  static sdk::OptionSchema option_schema(Recipe recipe);

  sdk::OpPrecision plan(const sdk::OpDescription& op) const override;
  bool needs_loss_scaling() const override { return false; }
  sdk::BlockScaledOperandPlan operand_plan(const sdk::OperandSlot& slot, sdk::GemmPass pass,
                                           sdk::ReductionAxis axis) const override;
  bool random_hadamard_transform(const sdk::OperandSlot& gemm) const override;

 private:
  Recipe recipe_;
  bool bf16_base_ = true;
  bool power_of_two_scales_ = false;  // fp8-block
  bool e5m2_gradients_ = false;       // mxfp8 hybrid
  bool ocp_scale_rule_ = false;       // mxfp8
  bool stochastic_rounding_ = false;  // nvfp4
  bool random_hadamard_ = false;      // nvfp4
};

// One factory per recipe, for the plugin descriptor.
template <Recipe R>
class RecipePolicy final : public BlockScaledPolicy {
 public:
  RecipePolicy(const sdk::Options& options, const sdk::PluginContext& context)
      : BlockScaledPolicy(R, options, context) {}
};

}  // namespace mixtrain::block_scaling
