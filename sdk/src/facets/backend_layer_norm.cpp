// LayerNormFacet (backend_layer_norm.h): its out-of-line anchor, its ops' names in messages, their rows
// of the signature table and the default supports() that answers from them.
#include "mixtrain/sdk/backend_layer_norm.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

LayerNormFacet::~LayerNormFacet() = default;

std::string_view op_name(LayerNormOp op) noexcept {
  switch (op) {
    case LayerNormOp::layernorm_forward:
      return "layernorm_forward";
    case LayerNormOp::layernorm_backward:
      return "layernorm_backward";
  }
  return "?";
}

OpSignature op_signature(LayerNormOp op) noexcept {
  switch (op) {
    case LayerNormOp::layernorm_forward:
    case LayerNormOp::layernorm_backward:
      return {kStore};  // {x}
  }
  return {};
}

bool LayerNormFacet::supports(LayerNormOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
