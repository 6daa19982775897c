// Bf16ExceptPolicy ("bf16-except"): bf16-mixed everywhere except the layers named by a glob,
// which stay entirely in FP32.
//
// Why: the classifier head (and sometimes the first layer) is where bf16's 8-bit mantissa costs
// accuracy, while it is a small share of the FLOPs. Core's [[precision.override]] can express the
// same per run; a policy makes the choice a named, reusable recipe.
//
// Contract
// - Option `fp32_layers`: comma-separated shell globs (fnmatch) over layer names, default
//   "head*"; "" keeps nothing in FP32.
// - plan(): softmax / loss / layernorm layers are pinned to FP32 (the autocast deny-list); a
//   layer whose name matches fp32_layers gets every dtype FP32; any other layer gets bf16 weights
//   copy, GEMM inputs, activations and activation gradients. Deterministic, no state.
// - Logs, per layer, the bytes of activation one row of the batch stores in the chosen dtype,
//   so the memory effect of the exception list is visible in the run log.
// - needs_loss_scaling() is false: bf16 has FP32's exponent range.
#pragma once

#include <string>
#include <vector>

#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/plugin.h"
#include "mixtrain/sdk/precision_policy.h"

namespace mixtrain_samples {

class Bf16ExceptPolicy final : public mixtrain::sdk::PrecisionPolicy {
 public:
  static mixtrain::sdk::OptionSchema option_schema();

  Bf16ExceptPolicy(const mixtrain::sdk::Options& options,
                   const mixtrain::sdk::PluginContext& context);

  mixtrain::sdk::LayerPrecision plan(const mixtrain::sdk::LayerDescription& layer) const override;
  bool needs_loss_scaling() const override { return false; }

  bool keeps_fp32(const std::string& layer_name) const;

 private:
  mixtrain::sdk::Logger logger_;
  std::vector<std::string> globs_;
};

}  // namespace mixtrain_samples
