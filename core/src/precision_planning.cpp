#include "mixtrain/core/precision_planning.h"

#include <fnmatch.h>

namespace mixtrain::core {

void plan_precision(Model& model, sdk::PrecisionPolicy& policy,
                    const sdk::BackendCapabilities& capabilities,
                    const std::vector<PrecisionOverride>& overrides) {
  policy.adapt_to(capabilities);
  for (auto& layer : model.layers()) layer->set_precision(policy.plan(layer->description()));
  for (const auto& o : overrides) {
    bool matched = false;
    for (auto& layer : model.layers()) {
      if (fnmatch(o.pattern.c_str(), layer->name().c_str(), 0) != 0) continue;
      matched = true;
      auto p = layer->precision();
      if (o.weight) p.weight = *o.weight;
      if (o.gemm_input) p.gemm_input = *o.gemm_input;
      if (o.activation) p.activation = *o.activation;
      if (o.activation_grad) p.activation_grad = *o.activation_grad;
      layer->set_precision(p);
    }
    if (!matched) {
      std::string names;
      for (const auto& l : model.layers()) names += (names.empty() ? "" : ", ") + l->name();
      throw sdk::ConfigError(o.where, "precision.override.layers",
                             "'" + o.pattern + "' matches no layer",
                             "layers in this model: " + names);
    }
  }
  // Scaled (FP8) operands only where the final plan still computes in FP8: an override that
  // keeps a layer in bf16 takes it out of the policy's scaling.
  if (policy.uses_scaled_operands())
    for (auto& layer : model.layers())
      if (layer->has_gemm() && sdk::is_fp8(layer->precision().gemm_input))
        layer->set_operand_scaling(&policy);
}


}  // namespace mixtrain::core
