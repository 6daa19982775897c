// The recipes of the table-driven precision policies: per policy, the dtype of each tensor role
// in ordinary layers and whether the format needs a loss scaler.
//
// Contract: a recipe is plain constant data. Layers on the FP32 deny-list (normalisation,
// softmax / loss) ignore the recipe and stay FP32 — see TablePrecisionPolicy. Adding a policy
// (fp16-mixed, bf16-mixed, tf32) means adding a recipe here and one line to policies_plugin.cpp.
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

}  // namespace mixtrain::policies
