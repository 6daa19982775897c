// BatchNormFacet (backend_batch_norm.h): its out-of-line anchor, its ops' names in messages, their rows
// of the signature table and the default supports() that answers from them.
#include "mixtrain/sdk/backend_batch_norm.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

BatchNormFacet::~BatchNormFacet() = default;

std::string_view op_name(BatchNormOp op) noexcept {
  switch (op) {
    case BatchNormOp::batchnorm_forward_training:
      return "batchnorm_forward_training";
    case BatchNormOp::batchnorm_forward_inference:
      return "batchnorm_forward_inference";
    case BatchNormOp::batchnorm_backward:
      return "batchnorm_backward";
    case BatchNormOp::batchnorm_statistics:
      return "batchnorm_statistics";
    case BatchNormOp::batchnorm_backward_reduce:
      return "batchnorm_backward_reduce";
    case BatchNormOp::batchnorm_backward_elementwise:
      return "batchnorm_backward_elementwise";
    case BatchNormOp::batchnorm_add_forward:
      return "batchnorm_add_forward";
  }
  return "?";
}

OpSignature op_signature(BatchNormOp op) noexcept {
  switch (op) {
    case BatchNormOp::batchnorm_forward_training:
    case BatchNormOp::batchnorm_forward_inference:
    case BatchNormOp::batchnorm_backward:
    case BatchNormOp::batchnorm_statistics:
    case BatchNormOp::batchnorm_backward_reduce:
    case BatchNormOp::batchnorm_backward_elementwise:
    case BatchNormOp::batchnorm_add_forward:
      return {kStore};  // {x}
  }
  return {};
}

bool BatchNormFacet::supports(BatchNormOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
