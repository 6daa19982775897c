// LayerNormFacet (backend_layer_norm.h): its out-of-line anchor, its ops' names in messages, their rows
// of the signature table and the default supports() that answers from them.
#include "mixtrain/sdk/backend_layer_norm.h"
#include "mixtrain/sdk/error.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

LayerNormFacet::~LayerNormFacet() = default;

std::string_view op_name(LayerNormOp op) noexcept {
  switch (op) {
    case LayerNormOp::layernorm_forward:
      return "layernorm_forward";
    case LayerNormOp::layernorm_backward:
      return "layernorm_backward";
    case LayerNormOp::layernorm_backward_accumulate:
      return "layernorm_backward_accumulate";
    case LayerNormOp::layernorm_add_forward:
      return "layernorm_add_forward";
  }
  return "?";
}

OpSignature op_signature(LayerNormOp op) noexcept {
  switch (op) {
    case LayerNormOp::layernorm_forward:
    case LayerNormOp::layernorm_backward:
      return {kStore};  // {x}
    case LayerNormOp::layernorm_backward_accumulate:  // 1.1
    case LayerNormOp::layernorm_add_forward:          // 1.2
      return {};  // no row: offered only by a backend that answers for it
  }
  return {};
}

void LayerNormFacet::layernorm_backward_accumulate(TensorView, TensorView, TensorView, TensorView,
                                                   TensorView, TensorView, TensorView, TensorView,
                                                   bool) {
  throw BackendError("this backend's layer_norm facet has no layernorm_backward_accumulate",
                     "report this: the host asks supports(layernorm_backward_accumulate) before "
                     "it calls it and runs layernorm_backward and a sum where the answer is false");
}

void LayerNormFacet::layernorm_add_forward(const LayerNormAddArgs&) {
  throw BackendError("this backend's layer_norm facet has no layernorm_add_forward",
                     "report this: the host asks supports(layernorm_add_forward) before it calls "
                     "it and runs the add and the layer norm apart where the answer is false");
}

bool LayerNormFacet::supports(LayerNormOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
