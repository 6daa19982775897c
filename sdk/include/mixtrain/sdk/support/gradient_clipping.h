// The global-norm clipping coefficient, one definition for the host's step and every backend's
// gated optimizer update (OptimizerFacet 1.1), so that an update clipped on the device multiplies
// the gradients by the very float the host would have passed (torch.nn.utils.clip_grad_norm_'s
// rule: c = max_norm / (‖g‖ + 1e-6) when ‖g‖ > max_norm).
//
// Contract
// - clip_coefficient(Σg², max_norm): ‖g‖ = sqrt(Σg²) and the quotient in double, rounded once to
//   float; 1 when max_norm <= 0 (no clipping) or ‖g‖ <= max_norm. Correctly rounded double sqrt
//   and division on both sides (IEEE 754; nvcc's fast-math flags touch only single precision), so
//   host and device agree bit for bit.
// - C++17 and no CUDA header, as float_format_rules.h (whose MIXTRAIN_SDK_HOST_DEVICE it uses).
#pragma once

#include <cmath>

#include "mixtrain/sdk/support/float_format_rules.h"

namespace mixtrain::sdk {

MIXTRAIN_SDK_HOST_DEVICE float clip_coefficient(double sum_of_squares, double max_norm) {
#if defined(__CUDA_ARCH__)
  const double norm = ::sqrt(sum_of_squares);
#else
  const double norm = std::sqrt(sum_of_squares);
#endif
  if (max_norm > 0.0 && norm > max_norm) return static_cast<float>(max_norm / (norm + 1e-6));
  return 1.0f;
}

}  // namespace mixtrain::sdk
