// AttentionFacet (backend_attention.h): its out-of-line anchor, its ops' names in messages, their rows
// of the signature table and the default supports() that answers from them.
#include "mixtrain/sdk/backend_attention.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

AttentionFacet::~AttentionFacet() = default;

std::string_view op_name(AttentionOp op) noexcept {
  switch (op) {
    case AttentionOp::split_heads:
      return "split_heads";
    case AttentionOp::merge_heads:
      return "merge_heads";
    case AttentionOp::softmax_forward:
      return "softmax_forward";
    case AttentionOp::softmax_backward:
      return "softmax_backward";
  }
  return "?";
}

OpSignature op_signature(AttentionOp op) noexcept {
  switch (op) {
    case AttentionOp::split_heads:
    case AttentionOp::merge_heads:
      return {kStorex2};  // {token-major, head-major}
    case AttentionOp::softmax_forward:
    case AttentionOp::softmax_backward:
      return {kF32};  // the softmax is FP32 whatever the policy
  }
  return {};
}

bool AttentionFacet::supports(AttentionOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
