// The calibration table `mixtrain calibrate` prints: one line per op and tensor measured, with
// its range and what each narrow format would do to it, then one line per op with the rung
// recommended and why.
//
// Contract
// - Columns: node, tensor, amax, decades (log10 of amax over the smallest non-zero magnitude; "-"
//   for a tensor with no non-zero value), then per format a risk cell: "ok", "flush 12%" (more
//   than none of the non-zero values round to zero), "sat 0.3%" (values above the format's max),
//   or both. fp16 and bf16 are unscaled; "fp16@S" is fp16 at the recommended loss scale (gradients
//   only; shown when the policy needs loss scaling); e4m3 and e5m2 are with per-tensor scaling
//   (range_statistics.h); "jump" is the largest step-to-step amax growth (recommendation.h).
// - Pure text, deterministic; columns padded to the widest cell.
#pragma once

#include <string>

#include "mixtrain/core/precision/calibration.h"
#include "mixtrain/core/precision/recommendation.h"

namespace mixtrain::core {

std::string calibration_table(const Calibration& calibration, const Recommendation& recommendation);

}  // namespace mixtrain::core
