// unscaled_narrow_gradients: the one warning about a precision policy that stores gradients in a
// narrow format (fp16) while no loss scaler is configured, shared by `check` and the start of
// `train` so both say the same thing.
//
// Contract: `policy` has been adapted to the model (PrecisionPolicy::adapt_to ran, so "auto" is
// resolved); returns the warning's one line, or nothing when the policy needs no loss scaling or
// a scaler is configured. Throws nothing.
#pragma once

#include <optional>
#include <string>

#include "mixtrain/core/config/experiment.h"
#include "mixtrain/sdk/precision_policy.h"

namespace mixtrain::core {

std::optional<std::string> unscaled_narrow_gradients(const Experiment& experiment,
                                                     const sdk::PrecisionPolicy& policy);

}  // namespace mixtrain::core
