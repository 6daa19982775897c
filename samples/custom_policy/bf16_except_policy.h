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
// - plan(): an op whose name matches fp32_layers gets every dtype FP32; any other op gets bf16
//   weights copy, GEMM inputs, activations and activation gradients. Precision-sensitive ops
//   (OpDescription::precision_sensitive: layernorm statistics, softmax, loss) are planned FP32
//   too, only so the log says what runs: the host pins them to FP32 whatever a policy plans, so
//   no policy needs a list of op kinds. Deterministic, no state.
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

  mixtrain::sdk::OpPrecision plan(const mixtrain::sdk::OpDescription& op) const override;
  bool needs_loss_scaling() const override { return false; }

  bool keeps_fp32(const std::string& layer_name) const;

 private:
  mixtrain::sdk::Logger logger_;
  std::vector<std::string> globs_;
};

}  // namespace mixtrain_samples
