// DropoutFacet (backend_dropout.h): its out-of-line anchor, its ops' names in messages, their rows
// of the signature table and the default supports() that answers from them.
#include "mixtrain/sdk/backend_dropout.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

DropoutFacet::~DropoutFacet() = default;

std::string_view op_name(DropoutOp op) noexcept {
  switch (op) {
    case DropoutOp::dropout_forward:
      return "dropout_forward";
    case DropoutOp::dropout_backward:
      return "dropout_backward";
  }
  return "?";
}

OpSignature op_signature(DropoutOp op) noexcept {
  switch (op) {
    case DropoutOp::dropout_forward:
    case DropoutOp::dropout_backward:
      return {kStorex2};  // {x, y} and {dy, dx}: either mix, rounded once
  }
  return {};
}

bool DropoutFacet::supports(DropoutOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
