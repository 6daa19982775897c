// AttentionFacet (backend_attention.h): its out-of-line anchor, its ops' names in messages, their rows
// of the signature table and the default supports() that answers from them.
#include "mixtrain/sdk/backend_attention.h"
#include "mixtrain/sdk/error.h"
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
    case AttentionOp::flash_forward:
      return "flash_forward";
    case AttentionOp::flash_backward:
      return "flash_backward";
    case AttentionOp::flash_decode:
      return "flash_decode";
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
    case AttentionOp::flash_forward:
      return {kStore};  // {qkv}
    case AttentionOp::flash_backward:
      return {kStorex2};  // {qkv, dout}
    case AttentionOp::flash_decode:
      return {kStorex2};  // {cache, out}
  }
  return {};
}

// The flash ops (1.1) are offered only by a backend that implements them and says so.
bool AttentionFacet::supports(AttentionOp op, std::span<const DType> dtypes) const {
  if (op == AttentionOp::flash_forward || op == AttentionOp::flash_backward ||
      op == AttentionOp::flash_decode)
    return false;
  return signature_accepts(op, dtypes);
}

void AttentionFacet::flash_forward(TensorView, const HeadLayout&, float, TensorView, TensorView) {
  throw BackendError(
      "this backend does not offer flash attention (attention facet 1.1's "
      "flash_forward)",
      "run the unfused attention (the host does when supports() says no), or use "
      "a backend that offers it (the CPU backend)");
}

void AttentionFacet::flash_backward(TensorView, TensorView, TensorView, TensorView,
                                    const HeadLayout&, float, TensorView) {
  throw BackendError(
      "this backend does not offer flash attention (attention facet 1.1's "
      "flash_backward)",
      "run the unfused attention (the host does when supports() says no), or use "
      "a backend that offers it (the CPU backend)");
}

void AttentionFacet::flash_decode(TensorView, const HeadLayout&, float, TensorView) {
  throw BackendError(
      "this backend does not offer flash_decode (attention facet 1.3)",
      "report this: the host asks supports(flash_decode) before it calls it and decodes "
      "unfused where the answer is false");
}

std::string AttentionFacet::flash_refusal(const HeadLayout&, DType) const {
  return {};
}

}  // namespace mixtrain::sdk
