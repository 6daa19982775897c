// The block-scaled weight layouts the conformance suite decodes on every backend that offers
// QuantizedWeightFacet::dequantize_block_scaled, one list that a backend's own unit tests loop
// over too: FP8 blocks of 128×128 with and without NVFP4's tensor scale, MX along either
// dimension in each element format (E4M3, E5M2, E2M1), and NVFP4 (sdk/support/block_scaling.h).
// Header-only, installed with the kit.
#pragma once

#include <vector>

#include "mixtrain/sdk/support/block_scaling.h"

namespace mixtrain::conformance {

inline std::vector<sdk::BlockScaledLayout> block_scaled_weight_layouts() {
  return {sdk::fp8_block_weight_layout(),
          sdk::fp8_block_weight_layout(sdk::BlockElement::e4m3, true),
          sdk::mx_layout(sdk::ReductionAxis::cols, sdk::BlockElement::e4m3),
          sdk::mx_layout(sdk::ReductionAxis::rows, sdk::BlockElement::e5m2),
          sdk::mx_layout(sdk::ReductionAxis::cols, sdk::BlockElement::e2m1),
          sdk::nvfp4_weight_layout()};
}

}  // namespace mixtrain::conformance
