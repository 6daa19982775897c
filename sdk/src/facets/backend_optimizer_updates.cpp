// OptimizerFacet (backend_optimizer_updates.h): its out-of-line anchor, its ops' names in messages, their rows
// of the signature table and the default supports() that answers from them.
#include "mixtrain/sdk/backend_optimizer_updates.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

OptimizerFacet::~OptimizerFacet() = default;

std::string_view op_name(OptimizerOp op) noexcept {
  switch (op) {
    case OptimizerOp::sgd_update:
      return "sgd_update";
    case OptimizerOp::adamw_update:
      return "adamw_update";
    case OptimizerOp::sgd_update_gated:
      return "sgd_update_gated";
    case OptimizerOp::adamw_update_gated:
      return "adamw_update_gated";
  }
  return "?";
}

OpSignature op_signature(OptimizerOp op) noexcept {
  switch (op) {
    case OptimizerOp::sgd_update:
    case OptimizerOp::adamw_update:
    case OptimizerOp::sgd_update_gated:
    case OptimizerOp::adamw_update_gated:
      return {kF32Store};  // {master, working}
  }
  return {};
}

bool OptimizerFacet::supports(OptimizerOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
