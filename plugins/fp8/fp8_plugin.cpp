// Descriptor of libmixtrain_fp8: the FP8 precision policies fp8-delayed and fp8-current.
#include "mixtrain/sdk/plugin.h"

#include "current_scaling_policy.h"
#include "delayed_scaling_policy.h"

namespace {

std::vector<mixtrain::sdk::ComponentInfo> fp8_components() {
  using namespace mixtrain;
  return {
      {sdk::ComponentKind::policy, "fp8-delayed",
       "FP8 GEMM operands scaled from an amax history (Transformer Engine delayed scaling); "
       "the rest from a base recipe",
       fp8::DelayedScalingPolicy::option_schema(),
       &sdk::make_component<fp8::DelayedScalingPolicy>},
      {sdk::ComponentKind::policy, "fp8-current",
       "FP8 GEMM operands scaled from the amax of the tensor being cast; the rest from a base "
       "recipe",
       fp8::CurrentScalingPolicy::option_schema(),
       &sdk::make_component<fp8::CurrentScalingPolicy>},
  };
}

}  // namespace

MIXTRAIN_PLUGIN("fp8", "0.1.0", fp8_components)
