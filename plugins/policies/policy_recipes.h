// The recipes of the table-driven precision policies: per policy, the dtype of each tensor role
// in ordinary ops and whether the format needs a loss scaler.
//
// Contract: a recipe is plain constant data. Precision-sensitive ops (normalisation, softmax,
// loss) ignore the recipe and stay FP32: the host pins them from the op's own trait. Adding a
// policy (fp16-mixed, bf16-mixed, tf32) means adding a recipe here and one line to
// policies_plugin.cpp.
#pragma once

#include <string_view>

#include "mixtrain/sdk/dtype.h"

namespace mixtrain::policies {

struct PolicyRecipe {
  std::string_view name;         // selected in TOML: [precision] policy = "<name>"
  std::string_view description;  // one line, shown by `mixtrain plugins`
  sdk::DType weight;             // working copy of GEMM weights
  sdk::DType gemm_input;         // GEMM A/B operands (tf32: fp32 storage rounded at the GEMM)
  sdk::DType activation;         // layer outputs kept for backward
  sdk::DType activation_grad;    // gradients flowing between layers
  bool needs_loss_scaling;       // narrow exponent range (fp16)
};

inline constexpr PolicyRecipe kFp32Recipe{
    /* .name = */ "fp32",
    /* .description = */ "everything in fp32 (the reference baseline)",
    /* .weight = */ sdk::DType::fp32,
    /* .gemm_input = */ sdk::DType::fp32,
    /* .activation = */ sdk::DType::fp32,
    /* .activation_grad = */ sdk::DType::fp32,
    /* .needs_loss_scaling = */ false,
};

// TF32: fp32 storage everywhere; GEMM operands rounded to 10 mantissa bits (Ampere+ default for
// matmuls in many frameworks). Same exponent range as fp32, so no loss scaling.
inline constexpr PolicyRecipe kTf32Recipe{
    /* .name = */ "tf32",
    /* .description = */ "fp32 storage, GEMM inputs rounded to tf32 (10-bit mantissa)",
    /* .weight = */ sdk::DType::fp32,
    /* .gemm_input = */ sdk::DType::tf32,
    /* .activation = */ sdk::DType::fp32,
    /* .activation_grad = */ sdk::DType::fp32,
    /* .needs_loss_scaling = */ false,
};

// FP16 mixed precision (Micikevicius et al.): fp16 weights copies, GEMM inputs, activations and
// activation gradients; FP32 masters, accumulation, weight gradients and optimizer state. Five
// exponent bits: small gradients flush to zero without a loss scaler.
inline constexpr PolicyRecipe kFp16MixedRecipe{
    /* .name = */ "fp16-mixed",
    /* .description = */
    "fp16 weights copies, GEMM inputs, activations and their gradients; fp32 masters (needs a loss "
    "scaler)",
    /* .weight = */ sdk::DType::fp16,
    /* .gemm_input = */ sdk::DType::fp16,
    /* .activation = */ sdk::DType::fp16,
    /* .activation_grad = */ sdk::DType::fp16,
    /* .needs_loss_scaling = */ true,
};

// BF16 mixed precision: fp32's exponent range with 8 significant bits, so no loss scaler.
inline constexpr PolicyRecipe kBf16MixedRecipe{
    /* .name = */ "bf16-mixed",
    /* .description = */
    "bf16 weights copies, GEMM inputs, activations and their gradients; fp32 masters",
    /* .weight = */ sdk::DType::bf16,
    /* .gemm_input = */ sdk::DType::bf16,
    /* .activation = */ sdk::DType::bf16,
    /* .activation_grad = */ sdk::DType::bf16,
    /* .needs_loss_scaling = */ false,
};

}  // namespace mixtrain::policies
