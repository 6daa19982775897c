// The signature table (op_signatures.h) and the facets' default supports(), which answer from it.
#include "mixtrain/sdk/op_signatures.h"

#include "mixtrain/sdk/backend_activation.h"
#include "mixtrain/sdk/backend_attention.h"
#include "mixtrain/sdk/backend_batch_norm.h"
#include "mixtrain/sdk/backend_convolution.h"
#include "mixtrain/sdk/backend_dropout.h"
#include "mixtrain/sdk/backend_embedding.h"
#include "mixtrain/sdk/backend_foreach.h"
#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/backend_gradient_check.h"
#include "mixtrain/sdk/backend_layer_norm.h"
#include "mixtrain/sdk/backend_loss.h"
#include "mixtrain/sdk/backend_optimizer_updates.h"
#include "mixtrain/sdk/backend_residual.h"

namespace mixtrain::sdk {

namespace {

using C = DTypeClass;
constexpr C kF32[] = {C::fp32};
constexpr C kF32x2[] = {C::fp32, C::fp32};
constexpr C kF32x3[] = {C::fp32, C::fp32, C::fp32};
constexpr C kStore[] = {C::storage_float};
constexpr C kStorex2[] = {C::storage_float, C::storage_float};
constexpr C kStorex3[] = {C::storage_float, C::storage_float, C::storage_float};
constexpr C kStoreF32[] = {C::storage_float, C::fp32};  // e.g. {dy, dbias}, {x, y} of axpy
constexpr C kF32Store[] = {C::fp32, C::storage_float};  // {master, working}
constexpr C kOperandx2Out[] = {C::gemm_operand, C::gemm_operand, C::storage_float};
constexpr C kOperandx2[] = {C::gemm_operand, C::gemm_operand};

bool fp32_storage(DType t) {
  return t == DType::fp32 || t == DType::tf32;
}

}  // namespace

bool in_class(DTypeClass c, DType t) noexcept {
  switch (c) {
    case C::fp32:
      return fp32_storage(t);
    case C::storage_float:
      return fp32_storage(t) || t == DType::bf16 || t == DType::fp16;
    case C::gemm_operand:
      return in_class(C::storage_float, t) || is_fp8(t);
  }
  return false;
}

bool signature_accepts(const OpSignature& sig, std::span<const DType> dtypes) noexcept {
  // No positions: the op is outside its enum, which no backend runs.
  if (sig.positions.empty() || dtypes.size() > sig.positions.size()) return false;
  for (std::size_t i = 0; i < dtypes.size(); ++i)
    if (!in_class(sig.positions[i], dtypes[i])) return false;
  if (sig.one_dtype)
    for (DType t : dtypes)
      if (t != dtypes[0] && !(fp32_storage(t) && fp32_storage(dtypes[0]))) return false;
  return true;
}

OpSignature op_signature(GemmOp op) noexcept {
  switch (op) {
    case GemmOp::gemm:
    case GemmOp::gemm_strided_batched:
    case GemmOp::gemm_grouped:
      return {kOperandx2Out};  // {A, B, C}
  }
  return {};
}

OpSignature op_signature(ActivationOp op) noexcept {
  switch (op) {
    case ActivationOp::bias_grad:
      return {kStoreF32};  // {dy, dbias}
    case ActivationOp::activation_forward:
      return {kStorex2};  // {x, y}
    case ActivationOp::activation_backward:
      return {kStorex3};  // {x, dy, dx}
    case ActivationOp::axpy:
      return {kStoreF32};  // {x, y}
  }
  return {};
}

OpSignature op_signature(ResidualOp op) noexcept {
  switch (op) {
    case ResidualOp::add:
      return {kStorex2};  // {x, y}
  }
  return {};
}

OpSignature op_signature(GradientCheckOp op) noexcept {
  switch (op) {
    case GradientCheckOp::unscale_and_check_finite:
    case GradientCheckOp::unscale_check_and_sum_squares:
      return {kF32};  // {grads}
    case GradientCheckOp::first_nonfinite:
      return {kStore};  // {tensors}
  }
  return {};
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

OpSignature op_signature(LayerNormOp op) noexcept {
  switch (op) {
    case LayerNormOp::layernorm_forward:
    case LayerNormOp::layernorm_backward:
      return {kStore};  // {x}
  }
  return {};
}

OpSignature op_signature(BatchNormOp op) noexcept {
  switch (op) {
    case BatchNormOp::batchnorm_forward_training:
    case BatchNormOp::batchnorm_forward_inference:
    case BatchNormOp::batchnorm_backward:
    case BatchNormOp::batchnorm_statistics:
    case BatchNormOp::batchnorm_backward_reduce:
    case BatchNormOp::batchnorm_backward_elementwise:
      return {kStore};  // {x}
  }
  return {};
}

OpSignature op_signature(LossOp op) noexcept {
  switch (op) {
    case LossOp::softmax_cross_entropy:
      return {kStore};  // {logits}; labels are int32
  }
  return {};
}

OpSignature op_signature(OptimizerOp op) noexcept {
  switch (op) {
    case OptimizerOp::sgd_update:
    case OptimizerOp::adamw_update:
      return {kF32Store};  // {master, working}
  }
  return {};
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

OpSignature op_signature(EmbeddingOp op) noexcept {
  switch (op) {
    case EmbeddingOp::gather:
      return {kStorex2};  // {table, out}
    case EmbeddingOp::scatter_add:
      return {kStore};  // {dy}; dtable is fp32
  }
  return {};
}

OpSignature op_signature(ConvolutionOp op) noexcept {
  switch (op) {
    case ConvolutionOp::conv2d_forward:
    case ConvolutionOp::conv2d_backward_data:
      return {kOperandx2Out};  // {x, w, y} and {dy, w, dx}
    case ConvolutionOp::conv2d_backward_weights:
      return {kOperandx2};  // {x, dy}
    case ConvolutionOp::pool2d_forward:
    case ConvolutionOp::pool2d_backward:
      return {kStorex2, true};  // {x, y}, {dy, dx}: one dtype
    case ConvolutionOp::to_channels_last:
    case ConvolutionOp::to_channels_first:
      return {kStorex2};  // {src, dst}: either mix, rounded once
  }
  return {};
}

OpSignature op_signature(DropoutOp op) noexcept {
  switch (op) {
    case DropoutOp::dropout_forward:
    case DropoutOp::dropout_backward:
      return {kStorex2};  // {x, y} and {dy, dx}: either mix, rounded once
  }
  return {};
}

// The facets' default answers.
bool GemmFacet::supports(GemmOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}
bool ActivationFacet::supports(ActivationOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}
bool ResidualFacet::supports(ResidualOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}
bool GradientCheckFacet::supports(GradientCheckOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}
bool ForeachFacet::supports(ForeachOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}
bool LayerNormFacet::supports(LayerNormOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}
bool BatchNormFacet::supports(BatchNormOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}
bool LossFacet::supports(LossOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}
bool OptimizerFacet::supports(OptimizerOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}
bool AttentionFacet::supports(AttentionOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}
bool EmbeddingFacet::supports(EmbeddingOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}
bool ConvolutionFacet::supports(ConvolutionOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}
bool DropoutFacet::supports(DropoutOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
