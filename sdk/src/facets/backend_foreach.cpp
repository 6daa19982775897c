// ForeachFacet (backend_foreach.h): its out-of-line anchor, its ops' names in messages, their rows
// of the signature table and the default supports() that answers from them.
#include "mixtrain/sdk/backend_foreach.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

ForeachFacet::~ForeachFacet() = default;

std::string_view op_name(ForeachOp op) noexcept {
  switch (op) {
    case ForeachOp::foreach_mul_scalar:
      return "foreach_mul_scalar";
    case ForeachOp::foreach_mul:
      return "foreach_mul";
    case ForeachOp::foreach_add_scalar:
      return "foreach_add_scalar";
    case ForeachOp::foreach_add:
      return "foreach_add";
    case ForeachOp::foreach_addcmul:
      return "foreach_addcmul";
    case ForeachOp::foreach_sqrt:
      return "foreach_sqrt";
    case ForeachOp::foreach_sign:
      return "foreach_sign";
    case ForeachOp::foreach_lerp:
      return "foreach_lerp";
    case ForeachOp::foreach_clamp:
      return "foreach_clamp";
  }
  return "?";
}

OpSignature op_signature(ForeachOp op) noexcept {
  switch (op) {
    case ForeachOp::foreach_mul_scalar:
    case ForeachOp::foreach_add_scalar:
    case ForeachOp::foreach_sqrt:
    case ForeachOp::foreach_sign:
    case ForeachOp::foreach_clamp:
      return {kF32};  // {self}
    case ForeachOp::foreach_mul:
    case ForeachOp::foreach_add:
    case ForeachOp::foreach_lerp:
      return {kF32x2};  // {self, other}
    case ForeachOp::foreach_addcmul:
      return {kF32x3};  // {self, t1, t2}
  }
  return {};
}

bool ForeachFacet::supports(ForeachOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
