// LossFacet (backend_loss.h): its out-of-line anchor, its ops' names in messages, their rows
// of the signature table and the default supports() that answers from them.
#include "mixtrain/sdk/backend_loss.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

LossFacet::~LossFacet() = default;

std::string_view op_name(LossOp op) noexcept {
  switch (op) {
    case LossOp::softmax_cross_entropy:
      return "softmax_cross_entropy";
  }
  return "?";
}

OpSignature op_signature(LossOp op) noexcept {
  switch (op) {
    case LossOp::softmax_cross_entropy:
      return {kStore};  // {logits}; labels are int32
  }
  return {};
}

bool LossFacet::supports(LossOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
