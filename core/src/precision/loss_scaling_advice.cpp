// The warning for narrow gradients without a loss scaler (contract in loss_scaling_advice.h).
#include "mixtrain/core/precision/loss_scaling_advice.h"

#include <vector>

namespace mixtrain::core {

std::optional<std::string> unscaled_narrow_gradients(const Experiment& experiment,
                                                     const sdk::PrecisionPolicy& policy,
                                                     const Model& model) {
  if (experiment.scaler_type != "none") return std::nullopt;
  if (policy.needs_loss_scaling())
    return "policy '" + experiment.policy_name +
           "' stores gradients in a narrow format but scaler.type = \"none\": small gradients "
           "will flush to zero; set scaler.type = \"dynamic\"";
  std::vector<std::string> fp16;
  for (const auto& l : model.layers())
    if (l->precision().activation_grad == sdk::DType::fp16) fp16.push_back(l->name());
  if (fp16.empty()) return std::nullopt;
  constexpr std::size_t kNamed = 4;
  std::string names;
  for (std::size_t i = 0; i < fp16.size() && i < kNamed; ++i) names += (i ? ", " : "") + fp16[i];
  if (fp16.size() > kNamed) names += " and " + std::to_string(fp16.size() - kNamed) + " more";
  return "[[precision.override]] makes the gradients of " + names +
         " fp16 but scaler.type = \"none\": small gradients will flush to zero; set "
         "scaler.type = \"dynamic\"";
}

}  // namespace mixtrain::core
