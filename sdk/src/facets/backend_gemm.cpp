// GemmFacet (backend_gemm.h): its out-of-line anchor, its ops' names in messages, their rows
// of the signature table and the default supports() that answers from them.
#include "mixtrain/sdk/backend_gemm.h"
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
  }
  return "?";
}

// Every backend has a grouped GEMM: its own gemm, once per member (facet 1.1's default).
void GemmFacet::gemm_grouped(std::span<const GemmArgs> group) {
  for (const GemmArgs& args : group) gemm(args);
}

OpSignature op_signature(GemmOp op) noexcept {
  switch (op) {
    case GemmOp::gemm:
    case GemmOp::gemm_strided_batched:
    case GemmOp::gemm_grouped:
      return {kOperandx2Out};  // {A, B, C}
  }
  return {};
}

bool GemmFacet::supports(GemmOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
