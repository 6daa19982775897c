// ResidualFacet (backend_residual.h): its out-of-line anchor, its ops' names in messages, their rows
// of the signature table and the default supports() that answers from them.
#include "mixtrain/sdk/backend_residual.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

ResidualFacet::~ResidualFacet() = default;

std::string_view op_name(ResidualOp op) noexcept {
  switch (op) {
    case ResidualOp::add:
      return "add";
    case ResidualOp::add_backward:
      return "add_backward";
  }
  return "?";
}

OpSignature op_signature(ResidualOp op) noexcept {
  switch (op) {
    case ResidualOp::add:
      return {kStorex2};  // {x, y}
    case ResidualOp::add_backward:
      return {kStorex2};  // {dy, dx}
  }
  return {};
}

bool ResidualFacet::supports(ResidualOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
