// Descriptor of libmixtrain_block_scaling: the block-scaled precision policies fp8-block, mxfp8
// and nvfp4.
#include "block_scaled_policy.h"
#include "mixtrain/sdk/plugin.h"

namespace {

std::vector<mixtrain::sdk::ComponentInfo> block_scaling_components() {
  using namespace mixtrain;
  using block_scaling::Recipe;
  using block_scaling::RecipePolicy;
  return {
      {sdk::ComponentKind::policy, "fp8-block",
       "FP8 E4M3 GEMM operands with fp32 scales per 1x128 tile (activations, gradients) and per "
       "128x128 block (weights): Transformer Engine's Float8BlockScaling",
       block_scaling::BlockScaledPolicy::option_schema(Recipe::fp8_block),
       &sdk::make_component<RecipePolicy<Recipe::fp8_block>>},
      {sdk::ComponentKind::policy, "mxfp8",
       "MXFP8 GEMM operands: E4M3 (or E5M2 gradients) with an E8M0 scale per 32 along the "
       "reduction dim: Transformer Engine's MXFP8BlockScaling",
       block_scaling::BlockScaledPolicy::option_schema(Recipe::mxfp8),
       &sdk::make_component<RecipePolicy<Recipe::mxfp8>>},
      {sdk::ComponentKind::policy, "nvfp4",
       "NVFP4 GEMM operands: E2M1 with E4M3 scales per 16 (16x16 weights) and an fp32 tensor "
       "scale: Transformer Engine's NVFP4BlockScaling",
       block_scaling::BlockScaledPolicy::option_schema(Recipe::nvfp4),
       &sdk::make_component<RecipePolicy<Recipe::nvfp4>>},
  };
}

}  // namespace

MIXTRAIN_PLUGIN("block_scaling", "0.1.0", block_scaling_components)
