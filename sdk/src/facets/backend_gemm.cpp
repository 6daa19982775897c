// GemmFacet (backend_gemm.h): its out-of-line anchor, its ops' names in messages, their rows
// of the signature table and the default supports() that answers from them.
#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/error.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

GemmFacet::~GemmFacet() = default;

std::string_view op_name(GemmOp op) noexcept {
  switch (op) {
    case GemmOp::gemm:
      return "gemm";
    case GemmOp::gemm_strided_batched:
      return "gemm_strided_batched";
    case GemmOp::gemm_grouped:
      return "gemm_grouped";
    case GemmOp::quantize_block_scaled:
      return "quantize_block_scaled";
    case GemmOp::gemm_block_scaled:
      return "gemm_block_scaled";
    case GemmOp::gemm_gradient:
      return "gemm_gradient";
    case GemmOp::cast_transpose:
      return "cast_transpose";
    case GemmOp::cast_transpose_gradient:
      return "cast_transpose_gradient";
  }
  return "?";
}

// Every backend has a grouped GEMM: its own gemm, once per member (facet 1.1's default).
void GemmFacet::gemm_grouped(std::span<const GemmArgs> group) {
  for (const GemmArgs& args : group) gemm(args);
}

// Block-scaled ops are offered only by a backend that overrides them (and supports()).
void GemmFacet::quantize_block_scaled(const BlockQuantizeArgs&) {
  throw BackendError("this backend's gemm facet has no quantize_block_scaled",
                     "run block-scaled precision policies on the CPU backend's simulator "
                     "(--set backend.type=cpu)");
}

void GemmFacet::gemm_block_scaled(const BlockScaledGemmArgs&) {
  throw BackendError("this backend's gemm facet has no gemm_block_scaled",
                     "run block-scaled precision policies on the CPU backend's simulator "
                     "(--set backend.type=cpu)");
}

// A backend that offers the block-scaled ops runs every layout unless it says otherwise (1.3).
std::string GemmFacet::block_layout_refusal(const BlockScaledLayout&) const {
  return {};
}

// Stored as their sources unless a backend says otherwise (1.4).
bool GemmFacet::quantizes_transposed() const {
  return false;
}

// Offered only by a backend that overrides it (and supports()); the host then runs the unfused ops.
void GemmFacet::gemm_gradient(const GemmGradientArgs&) {
  throw BackendError("this backend's gemm facet has no gemm_gradient",
                     "report this: the host asks supports(gemm_gradient) before it calls it and "
                     "runs gemm, activation_backward and bias_grad where the answer is false");
}

// Offered only by a backend that overrides it (and supports()); the host then casts and the GEMM
// transposes what it needs.
void GemmFacet::cast_transpose(const CastTransposeArgs&) {
  throw BackendError("this backend's gemm facet has no cast_transpose",
                     "report this: the host asks supports(cast_transpose) before it calls it and "
                     "casts with DeviceBackend::cast where the answer is false");
}

// Offered only by a backend that overrides it (and supports()); the host then runs
// activation_backward, bias_grad and cast_transpose apart.
void GemmFacet::cast_transpose_gradient(const CastTransposeGradientArgs&) {
  throw BackendError("this backend's gemm facet has no cast_transpose_gradient",
                     "report this: the host asks supports(cast_transpose_gradient) before it calls "
                     "it and runs activation_backward, bias_grad and cast_transpose where the "
                     "answer is false");
}

// The block-scaled ops, gemm_gradient and the casts have no row: no backend runs them unless
// it answers for them itself.
OpSignature op_signature(GemmOp op) noexcept {
  switch (op) {
    case GemmOp::gemm:
    case GemmOp::gemm_strided_batched:
    case GemmOp::gemm_grouped:
      return {kOperandx2Out};  // {A, B, C}
    case GemmOp::quantize_block_scaled:
    case GemmOp::gemm_block_scaled:
    case GemmOp::gemm_gradient:
    case GemmOp::cast_transpose:
    case GemmOp::cast_transpose_gradient:
      return {};
  }
  return {};
}

bool GemmFacet::supports(GemmOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
