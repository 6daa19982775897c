// The log line of the periodic gradient-underflow measurement (run.underflow_every): one line
// however deep the model, the per-tensor shares go to metrics.jsonl.
//
// Contract
// - underflow_summary_line() names the narrow dtypes and the loss scale, the layer whose input
//   gradient loses the largest share of its non-zero values to zero (and that share), how many
//   layers lose any, and the layers whose gradients are all zero ("all zero": they have no share;
//   a "0.0%" there would read as "nothing flushed"). Layers are named without the " input
//   gradient" of metrics.jsonl's tensor names. A share above 0 never prints as 0.0%.
// - FP32 tensors are left out; with none left the line is empty (nothing to report).
#pragma once

#include <string>
#include <vector>

#include "mixtrain/core/graph/diagnostics.h"

namespace mixtrain::core {

std::string underflow_summary_line(const std::vector<UnderflowCount>& counts, float loss_scale);

// "87.3%", "<0.1%" for a share above 0 that rounds to 0.0%, "0%" for none.
std::string share_text(double share);

}  // namespace mixtrain::core
