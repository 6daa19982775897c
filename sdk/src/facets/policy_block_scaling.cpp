// BlockScalingFacet (policy_block_scaling.h): its out-of-line anchor, so its type is one across
// the libraries that implement and find it, and the names of the passes.
#include "mixtrain/sdk/policy_block_scaling.h"

namespace mixtrain::sdk {

BlockScalingFacet::~BlockScalingFacet() = default;

bool BlockScalingFacet::random_hadamard_transform(const OperandSlot& /*gemm*/) const {
  return false;
}

std::string_view gemm_pass_name(GemmPass pass) noexcept {
  switch (pass) {
    case GemmPass::forward:
      return "forward";
    case GemmPass::dgrad:
      return "dgrad";
    case GemmPass::wgrad:
      return "wgrad";
  }
  return "?";
}

}  // namespace mixtrain::sdk
