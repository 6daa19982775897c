// GradientCheckFacet (backend_gradient_check.h): its out-of-line anchor, its ops' names in messages, their rows
// of the signature table and the default supports() that answers from them.
#include "mixtrain/sdk/backend_gradient_check.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

GradientCheckFacet::~GradientCheckFacet() = default;

std::string_view op_name(GradientCheckOp op) noexcept {
  switch (op) {
    case GradientCheckOp::unscale_and_check_finite:
      return "unscale_and_check_finite";
    case GradientCheckOp::unscale_check_and_sum_squares:
      return "unscale_check_and_sum_squares";
    case GradientCheckOp::first_nonfinite:
      return "first_nonfinite";
    case GradientCheckOp::queue_unscale_check:
      return "queue_unscale_check";
    case GradientCheckOp::count_underflow:
      return "count_underflow";
  }
  return "?";
}

OpSignature op_signature(GradientCheckOp op) noexcept {
  switch (op) {
    case GradientCheckOp::unscale_and_check_finite:
    case GradientCheckOp::unscale_check_and_sum_squares:
    case GradientCheckOp::queue_unscale_check:
      return {kF32};  // {grads}
    case GradientCheckOp::count_underflow:
      return {kF32};  // {values}
    case GradientCheckOp::first_nonfinite:
      return {kStore};  // {tensors}
  }
  return {};
}

bool GradientCheckFacet::supports(GradientCheckOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
