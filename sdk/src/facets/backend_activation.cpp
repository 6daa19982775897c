// ActivationFacet (backend_activation.h): its out-of-line anchor, its ops' names in messages, their rows
// of the signature table and the default supports() that answers from them.
#include "mixtrain/sdk/backend_activation.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

ActivationFacet::~ActivationFacet() = default;

std::string_view op_name(ActivationOp op) noexcept {
  switch (op) {
    case ActivationOp::bias_grad:
      return "bias_grad";
    case ActivationOp::activation_forward:
      return "activation_forward";
    case ActivationOp::activation_backward:
      return "activation_backward";
    case ActivationOp::axpy:
      return "axpy";
  }
  return "?";
}

OpSignature op_signature(ActivationOp op) noexcept {
  switch (op) {
    case ActivationOp::bias_grad:
      return {kStoreF32};  // {dy, dbias}
    case ActivationOp::activation_forward:
      return {kStorex2};  // {x, y}
    case ActivationOp::activation_backward:
      return {kStorex3};  // {x, dy, dx}
    case ActivationOp::axpy:
      return {kStoreF32};  // {x, y}
  }
  return {};
}

bool ActivationFacet::supports(ActivationOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
