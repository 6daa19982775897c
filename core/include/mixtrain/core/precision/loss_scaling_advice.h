// unscaled_narrow_gradients: the one warning about gradients stored in a narrow format (fp16)
// while no loss scaler is configured, shared by `check` and the start of `train` so both say the
// same thing: a precision policy that stores them so, or, under a policy that does not,
// [[precision.override]] tables that make some nodes' gradients fp16 (named).
//
// Contract: `policy` has been adapted to the model (PrecisionPolicy::adapt_to ran, so "auto" is
// resolved) and `model` is planned under it and its overrides; returns the warning's one line, or
// nothing when no gradient needs loss scaling or a scaler is configured. `resuming`: the run
// resumes a checkpoint, so the fix it names is the --set that switches the scaler (an edited
// config's other scaler is refused there). Throws nothing.
#pragma once

#include <optional>
#include <string>

#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/sdk/precision_policy.h"

namespace mixtrain::core {

std::optional<std::string> unscaled_narrow_gradients(const Experiment& experiment,
                                                     const sdk::PrecisionPolicy& policy,
                                                     const Model& model, bool resuming);

}  // namespace mixtrain::core
