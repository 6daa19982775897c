// The warning for narrow gradients without a loss scaler (contract in loss_scaling_advice.h).
#include "mixtrain/core/precision/loss_scaling_advice.h"

#include <vector>

#include "console/short_list.h"

namespace mixtrain::core {

std::optional<std::string> unscaled_narrow_gradients(const Experiment& experiment,
                                                     const sdk::PrecisionPolicy& policy,
                                                     const Model& model, bool resuming) {
  if (experiment.scaler_type != "none") return std::nullopt;
  // A resume switches the scaler only when the command line names it (README, --resume).
  const std::string fix =
      resuming ? "resume with --set scaler.type=dynamic" : "set scaler.type = \"dynamic\"";
  if (policy.needs_loss_scaling())
    return "policy '" + experiment.policy_name +
           "' stores gradients in a narrow format but scaler.type = \"none\": small gradients "
           "will flush to zero; " +
           fix;
  std::vector<std::string> fp16;
  for (const auto& l : model.layers())
    if (l->precision().activation_grad == sdk::DType::fp16) fp16.push_back(l->name());
  if (fp16.empty()) return std::nullopt;
  return "[[precision.override]] makes the gradients of " + short_list(fp16, 4) +
         " fp16 but scaler.type = \"none\": small gradients will flush to zero; " + fix;
}

}  // namespace mixtrain::core
