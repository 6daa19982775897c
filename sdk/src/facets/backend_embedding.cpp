// EmbeddingFacet (backend_embedding.h): its out-of-line anchor, its ops' names in messages, their rows
// of the signature table and the default supports() that answers from them.
#include "mixtrain/sdk/backend_embedding.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

EmbeddingFacet::~EmbeddingFacet() = default;

std::string_view op_name(EmbeddingOp op) noexcept {
  switch (op) {
    case EmbeddingOp::gather:
      return "gather";
    case EmbeddingOp::scatter_add:
      return "scatter_add";
  }
  return "?";
}

OpSignature op_signature(EmbeddingOp op) noexcept {
  switch (op) {
    case EmbeddingOp::gather:
      return {kStorex2};  // {table, out}
    case EmbeddingOp::scatter_add:
      return {kStore};  // {dy}; dtable is fp32
  }
  return {};
}

bool EmbeddingFacet::supports(EmbeddingOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
