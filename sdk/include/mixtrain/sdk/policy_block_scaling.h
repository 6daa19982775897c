// BlockScalingFacet: what a precision policy with block-scaled GEMM operands (fp8-block, mxfp8,
// nvfp4) tells the host about each operand: the layout it is quantized to in each pass of a GEMM.
//
// Contract
// - A policy offers it by deriving from it beside PrecisionPolicy; the host finds it with
//   dynamic_cast on the policy (an older policy never derives from it, so adding it changed no
//   core interface). Versioned as a facet (facet.h: name, major.minor, the same step rules, its
//   own record in the ABI guard); the host calls only what the policy's minor declares.
// - The host quantizes block-scaled operands only for ops whose final plan (after the
//   precision-sensitive pin and the [[precision.override]] entries) still has an fp8 gemm_input:
//   plan() marks the GEMMs it block-scales that way, and an override to another dtype takes the op
//   out of block scaling. An op that has such GEMMs but no block-scaled path is refused at plan
//   time, naming the node.
// - The passes of a GEMM y = x·Wᵀ and the operands' reduction dims, for operands as stored
//   (x [rows, in], W [out, in], dy [rows, out]): forward reduces x and W along their cols (in);
//   dgrad dx = dy·W reduces dy along its cols and W along its rows (out); wgrad dW = dyᵀ·x
//   reduces dy and x along their rows (the batch). `axis` is that dim; the layout returned places
//   its 1-D blocks along it (block_along()) or is 2-D.
// - operand_plan() is deterministic and cheap; the host may call it at every quantization.
// - Stochastic rounding: the host draws the bits from the run's seed, the slot, the pass, the
//   optimizer step and the micro-batch (docs/architecture.md, "Number formats"), so a run resumed
//   from a checkpoint rounds exactly as the uninterrupted one.
// - Ownership: the facet is the policy itself; it lives as long as the policy.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <string_view>

#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/op_description.h"

namespace mixtrain::sdk {

enum class GemmPass : std::uint8_t { forward, dgrad, wgrad };
MIXTRAIN_SDK_API std::string_view gemm_pass_name(GemmPass pass) noexcept;

struct BlockScaledOperandPlan {
  BlockScaledLayout layout;
  bool stochastic_rounding = false;  // elements round stochastically (scales always to nearest)
};

class MIXTRAIN_SDK_API BlockScalingFacet : public Facet {
 public:
  static constexpr FacetVersion kVersion{1, 1};
  static constexpr std::string_view kName = "block_scaling";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }

  virtual BlockScaledOperandPlan operand_plan(const OperandSlot& slot, GemmPass pass,
                                              ReductionAxis axis) const = 0;

  // --- 1.1 ---------------------------------------------------------------------------------------
  // Whether the wgrad GEMM of `gemm` (dW = dyᵀ·x, the slot's role ignored) multiplies both its
  // inputs by a random Hadamard transform along the batch rows before they are quantized:
  // per 16 rows M = H·D/4, H the 16×16 Walsh–Hadamard matrix (Sylvester's ±1), D a diagonal of
  // random signs (support/block_scaling.h's hadamard16(); the host draws the signs from the run's
  // seed, the GEMM, the optimizer step and the micro-batch, one D for both inputs). MᵀM = I, so
  // dyᵀ·x is unchanged in exact arithmetic while outliers spread over their 16 rows. Default:
  // false.
  virtual bool random_hadamard_transform(const OperandSlot& gemm) const;

 protected:
  ~BlockScalingFacet() override;  // not owned through the facet: the policy is
};

}  // namespace mixtrain::sdk
