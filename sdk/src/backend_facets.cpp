// Out-of-line anchors of the backend facets and the names their ops go by in messages.
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/facet_list.h"

namespace mixtrain::sdk {

Facet::~Facet() = default;
GemmFacet::~GemmFacet() = default;
ActivationFacet::~ActivationFacet() = default;
ResidualFacet::~ResidualFacet() = default;
GradientCheckFacet::~GradientCheckFacet() = default;
ForeachFacet::~ForeachFacet() = default;
LayerNormFacet::~LayerNormFacet() = default;
BatchNormFacet::~BatchNormFacet() = default;
LossFacet::~LossFacet() = default;
OptimizerFacet::~OptimizerFacet() = default;
AttentionFacet::~AttentionFacet() = default;
EmbeddingFacet::~EmbeddingFacet() = default;
ConvolutionFacet::~ConvolutionFacet() = default;
DropoutFacet::~DropoutFacet() = default;
StepGraphFacet::~StepGraphFacet() = default;
NativeStreamFacet::~NativeStreamFacet() = default;
CallObserverFacet::~CallObserverFacet() = default;

std::string_view op_name(GemmOp op) noexcept {
  switch (op) {
    case GemmOp::gemm:
      return "gemm";
    case GemmOp::gemm_strided_batched:
      return "gemm_strided_batched";
    case GemmOp::gemm_grouped:
      return "gemm_grouped";
  }
  return "?";
}

// Every backend has a grouped GEMM: its own gemm, once per member (facet 1.1's default).
void GemmFacet::gemm_grouped(std::span<const GemmArgs> group) {
  for (const GemmArgs& args : group) gemm(args);
}

std::string_view op_name(ActivationOp op) noexcept {
  switch (op) {
    case ActivationOp::bias_grad:
      return "bias_grad";
    case ActivationOp::activation_forward:
      return "activation_forward";
    case ActivationOp::activation_backward:
      return "activation_backward";
    case ActivationOp::axpy:
      return "axpy";
  }
  return "?";
}

std::string_view op_name(ResidualOp op) noexcept {
  switch (op) {
    case ResidualOp::add:
      return "add";
  }
  return "?";
}

std::string_view op_name(GradientCheckOp op) noexcept {
  switch (op) {
    case GradientCheckOp::unscale_and_check_finite:
      return "unscale_and_check_finite";
    case GradientCheckOp::unscale_check_and_sum_squares:
      return "unscale_check_and_sum_squares";
    case GradientCheckOp::first_nonfinite:
      return "first_nonfinite";
  }
  return "?";
}

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

std::string_view op_name(LayerNormOp op) noexcept {
  switch (op) {
    case LayerNormOp::layernorm_forward:
      return "layernorm_forward";
    case LayerNormOp::layernorm_backward:
      return "layernorm_backward";
  }
  return "?";
}

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
  }
  return "?";
}

std::string_view op_name(LossOp op) noexcept {
  switch (op) {
    case LossOp::softmax_cross_entropy:
      return "softmax_cross_entropy";
  }
  return "?";
}

std::string_view op_name(OptimizerOp op) noexcept {
  switch (op) {
    case OptimizerOp::sgd_update:
      return "sgd_update";
    case OptimizerOp::adamw_update:
      return "adamw_update";
  }
  return "?";
}

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

std::string_view op_name(EmbeddingOp op) noexcept {
  switch (op) {
    case EmbeddingOp::gather:
      return "gather";
    case EmbeddingOp::scatter_add:
      return "scatter_add";
  }
  return "?";
}

std::string_view op_name(ConvolutionOp op) noexcept {
  switch (op) {
    case ConvolutionOp::conv2d_forward:
      return "conv2d_forward";
    case ConvolutionOp::conv2d_backward_data:
      return "conv2d_backward_data";
    case ConvolutionOp::conv2d_backward_weights:
      return "conv2d_backward_weights";
    case ConvolutionOp::pool2d_forward:
      return "pool2d_forward";
    case ConvolutionOp::pool2d_backward:
      return "pool2d_backward";
    case ConvolutionOp::to_channels_last:
      return "to_channels_last";
    case ConvolutionOp::to_channels_first:
      return "to_channels_first";
  }
  return "?";
}

std::string_view op_name(DropoutOp op) noexcept {
  switch (op) {
    case DropoutOp::dropout_forward:
      return "dropout_forward";
    case DropoutOp::dropout_backward:
      return "dropout_backward";
  }
  return "?";
}

}  // namespace mixtrain::sdk
