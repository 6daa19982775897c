// The vocabulary shared by the FP8 policies: the FP8 format per operand role, the base recipe
// for everything that is not an FP8 GEMM operand, the scale formula and the slot names.
//
// Contract
// - fp8_format "hybrid": input and weight operands E4M3 (precision), grad_output E5M2 (range);
//   "e4m3": every operand E4M3. These are Transformer Engine's Format.HYBRID / Format.E4M3.
// - A base recipe ("bf16-mixed", "fp16-mixed", "fp32") gives the working weight copy, the
//   activation storage and the activation-gradient storage; the FP8 cast happens per GEMM from
//   those tensors.
// - compute_scale() implements scale = (fp8_max(dtype) / amax) / 2^margin, evaluated in double
//   and rounded once to float, clamped to [FLT_MIN, FLT_MAX]. It returns nullopt when amax is
//   zero, negative, inf or NaN: the caller keeps its previous scale (Transformer Engine does the
//   same with torch.where(amax > 0 && isfinite(amax), new, old)).
// - A scaling slot is one operand of one GEMM of one node, named "<node>.<gemm>.<role>"
//   (sdk::OperandSlot::name()), role one of input, weight, grad_output. States of version 1
//   named slots "<layer>.<role>": the only op with a GEMM was a linear, with one GEMM, which the
//   host names "matmul"; slot_name_from_v1() renames such a name to "<layer>.matmul.<role>".
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/sdk/dtype.h"
#include "mixtrain/sdk/precision_policy.h"

namespace mixtrain::fp8 {

enum class Fp8Format { hybrid, e4m3 };

std::string_view fp8_format_name(Fp8Format f) noexcept;
Fp8Format parse_fp8_format(std::string_view name);  // std::invalid_argument when unknown
const std::vector<std::string>& fp8_format_names();

// The FP8 dtype an operand of `role` is cast to under `format`.
sdk::DType operand_dtype(Fp8Format format, sdk::OperandRole role) noexcept;

// Largest finite value of an FP8 dtype: 448 (E4M3), 57344 (E5M2).
double fp8_max(sdk::DType dtype);

struct BaseRecipe {
  std::string_view name;       // option value of `base`
  sdk::DType weight;           // working copy of GEMM weights (the FP8 cast reads it)
  sdk::DType activation;       // layer outputs kept for backward
  sdk::DType activation_grad;  // gradients flowing between layers
  bool needs_loss_scaling;     // fp16's narrow exponent range
};

const BaseRecipe& base_recipe(std::string_view name);  // std::invalid_argument when unknown
const std::vector<std::string>& base_recipe_names();

std::optional<float> compute_scale(float amax, sdk::DType dtype, int margin);

// The role of a slot name "<node>.<gemm>.<role>" (node and gemm non-empty), or nullopt when the
// name has another form.
std::optional<sdk::OperandRole> slot_role(std::string_view slot);
// "<layer>.<role>" (state version 1) -> "<layer>.matmul.<role>"; nullopt when the name does not
// end in ".<role>" after a non-empty layer name.
std::optional<std::string> slot_name_from_v1(std::string_view v1_slot);
inline constexpr std::string_view kV1SlotGemm = "matmul";

// "448", "0.5", "1.5e+10": short, exact enough for log lines.
std::string format_float(double value);

}  // namespace mixtrain::fp8
