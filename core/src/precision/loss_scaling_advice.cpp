// The warning for narrow gradients without a loss scaler (contract in loss_scaling_advice.h).
#include "mixtrain/core/precision/loss_scaling_advice.h"

namespace mixtrain::core {

std::optional<std::string> unscaled_narrow_gradients(const Experiment& experiment,
                                                     const sdk::PrecisionPolicy& policy) {
  if (!policy.needs_loss_scaling() || experiment.scaler_type != "none") return std::nullopt;
  return "policy '" + experiment.policy_name +
         "' stores gradients in a narrow format but scaler.type = \"none\": small gradients will "
         "flush to zero; set scaler.type = \"dynamic\"";
}

}  // namespace mixtrain::core
