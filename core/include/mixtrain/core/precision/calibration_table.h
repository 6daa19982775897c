// The calibration table `mixtrain calibrate` prints: one line per op and tensor measured, with
// its range and what each narrow format would do to it, then one line per op with the rung
// recommended and why.
//
// Contract
// - Columns: node, tensor, amax, decades (log10 of amax over the smallest non-zero magnitude; "-"
//   for a tensor with no non-zero value), then per format a risk cell: "ok", "flush 12%" (the
//   share of non-zero values that round to zero), "sat 0.3%" (the share above the format's max),
//   or both; any count above zero shows (format_share never rounds it to 0%). fp16 and bf16 are
//   unscaled; "fp16@2^S" is fp16 at the recommended loss scale (gradients only; shown when a loss
//   scale is recommended); e4m3/t and e5m2/t are with per-tensor scaling (range_statistics.h);
//   "jump" is the largest step-to-step amax growth (recommendation.h, largest_amax_jump).
// - With the block report (recommendation.h, BlockRecommendation): one line per operand and block
//   format (per-tensor cell, per-block cell, the share of the per-tensor losses per-block scaling
//   avoids), a verdict per format and the block-policy line.
// - Pure text, deterministic; columns padded to the widest cell.
#pragma once

#include <string>

#include "mixtrain/core/precision/calibration.h"
#include "mixtrain/core/precision/recommendation.h"

namespace mixtrain::core {

std::string calibration_table(const Calibration& calibration, const Recommendation& recommendation);

}  // namespace mixtrain::core
