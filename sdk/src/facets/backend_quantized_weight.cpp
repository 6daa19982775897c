// QuantizedWeightFacet (backend_quantized_weight.h): its out-of-line anchor, its op's name in
// messages, its row of the signature table and the default supports() that answers from it.
#include "mixtrain/sdk/backend_quantized_weight.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

QuantizedWeightFacet::~QuantizedWeightFacet() = default;

std::string_view op_name(QuantizedWeightOp op) noexcept {
  switch (op) {
    case QuantizedWeightOp::dequantize_nf4:
      return "dequantize_nf4";
  }
  return "?";
}

OpSignature op_signature(QuantizedWeightOp op) noexcept {
  switch (op) {
    case QuantizedWeightOp::dequantize_nf4:
      return {kF32Store};  // {absmax, out}
  }
  return {};
}

bool QuantizedWeightFacet::supports(QuantizedWeightOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
