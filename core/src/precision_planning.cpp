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

void check_backend_runs_plan(const Model& model, const sdk::BackendCapabilities& caps) {
  for (const auto& l : model.layers()) {
    if (!l->has_gemm()) continue;
    auto dt = l->precision().gemm_input;
    if (!caps.supports(dt)) {
      std::string have;
      for (const auto& d : caps.gemm_inputs)
        have += (have.empty() ? "" : ", ") + std::string(sdk::dtype_name(d.dtype));
      throw sdk::BackendError("layer '" + l->name() + "' needs " +
                                  std::string(sdk::dtype_name(dt)) + " GEMM inputs, which the " +
                                  caps.kind + " backend cannot run (it runs: " + have + ")",
                              "choose another precision.policy, or override this layer with "
                              "[[precision.override]] layers = \"" +
                                  l->name() + "\", compute = \"fp32\"");
    }
  }
}

}  // namespace mixtrain::core
