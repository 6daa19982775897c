// QuantizedWeightFacet (backend_quantized_weight.h): its out-of-line anchor, its op's name in
// messages, its rows of the signature table, the default supports() that answers from them, and
// 1.1's default dequantize_block_scaled, which refuses.
#include "mixtrain/sdk/backend_quantized_weight.h"
#include "mixtrain/sdk/error.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

QuantizedWeightFacet::~QuantizedWeightFacet() = default;

std::string_view op_name(QuantizedWeightOp op) noexcept {
  switch (op) {
    case QuantizedWeightOp::dequantize_nf4:
      return "dequantize_nf4";
    case QuantizedWeightOp::dequantize_block_scaled:
      return "dequantize_block_scaled";
  }
  return "?";
}

OpSignature op_signature(QuantizedWeightOp op) noexcept {
  switch (op) {
    case QuantizedWeightOp::dequantize_nf4:
      return {kF32Store};  // {absmax, out}
    case QuantizedWeightOp::dequantize_block_scaled:
      return {};  // no row: offered only by a backend that answers for it itself
  }
  return {};
}

// 1.1: offered only by a backend that overrides it (and supports()).
void QuantizedWeightFacet::dequantize_block_scaled(const BlockScaledWeight&, TensorView) {
  throw BackendError("this backend's quantized_weight facet has no dequantize_block_scaled",
                     "store the frozen base as train.frozen_format = \"compute\" or \"nf4\", or "
                     "run on the CPU backend (--set backend.type=cpu)");
}

bool QuantizedWeightFacet::supports(QuantizedWeightOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
