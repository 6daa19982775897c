#include "fp8_recipe.h"

#include <array>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <utility>

namespace mixtrain::fp8 {

namespace {
constexpr std::array<BaseRecipe, 3> kBaseRecipes{{
    {"bf16-mixed", sdk::DType::bf16, sdk::DType::bf16, sdk::DType::bf16, false},
    {"fp16-mixed", sdk::DType::fp16, sdk::DType::fp16, sdk::DType::fp16, true},
    {"fp32", sdk::DType::fp32, sdk::DType::fp32, sdk::DType::fp32, false},
}};
}  // namespace

std::string_view fp8_format_name(Fp8Format f) noexcept {
  return f == Fp8Format::hybrid ? "hybrid" : "e4m3";
}

Fp8Format parse_fp8_format(std::string_view name) {
  if (name == "hybrid") return Fp8Format::hybrid;
  if (name == "e4m3") return Fp8Format::e4m3;
  throw std::invalid_argument("unknown fp8_format '" + std::string(name) + "'");
}

const std::vector<std::string>& fp8_format_names() {
  static const std::vector<std::string> names{"hybrid", "e4m3"};
  return names;
}

sdk::DType operand_dtype(Fp8Format format, sdk::OperandRole role) noexcept {
  return format == Fp8Format::hybrid && role == sdk::OperandRole::grad_output
             ? sdk::DType::fp8_e5m2
             : sdk::DType::fp8_e4m3;
}

double fp8_max(sdk::DType dtype) {
  switch (dtype) {
    case sdk::DType::fp8_e4m3:
      return 448.0;
    case sdk::DType::fp8_e5m2:
      return 57344.0;
    default:
      break;
  }
  throw std::invalid_argument("fp8_max: " + std::string(sdk::dtype_name(dtype)) +
                              " is not an fp8 dtype");
}

const BaseRecipe& base_recipe(std::string_view name) {
  for (const auto& r : kBaseRecipes)
    if (r.name == name) return r;
  throw std::invalid_argument("unknown base recipe '" + std::string(name) + "'");
}

const std::vector<std::string>& base_recipe_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& r : kBaseRecipes) n.emplace_back(r.name);
    return n;
  }();
  return names;
}

std::optional<float> compute_scale(float amax, sdk::DType dtype, int margin) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return std::nullopt;
  // One rounding (double -> float) instead of two float divisions: exact for power-of-two
  // margins either way, and never 1 ulp off for odd amaxes.
  const double scale = fp8_max(dtype) / static_cast<double>(amax) / std::ldexp(1.0, margin);
  // A tiny amax would give an infinite scale (Transformer Engine clamps to FLT_MAX as well); a
  // huge amax with a large margin could round to 0, which would make scale_inv infinite.
  if (scale > static_cast<double>(FLT_MAX)) return FLT_MAX;
  if (scale < static_cast<double>(FLT_MIN)) return FLT_MIN;
  return static_cast<float>(scale);
}

namespace {
// The role `name` ends in after a '.', and the part before that '.'; nullopt when there is none
// or the part before is empty.
std::optional<std::pair<std::string_view, sdk::OperandRole>> split_role(std::string_view name) {
  const auto dot = name.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  const auto suffix = name.substr(dot + 1);
  for (auto role :
       {sdk::OperandRole::input, sdk::OperandRole::weight, sdk::OperandRole::grad_output})
    if (suffix == sdk::operand_role_name(role)) return std::pair{name.substr(0, dot), role};
  return std::nullopt;
}
}  // namespace

std::optional<sdk::OperandRole> slot_role(std::string_view slot) {
  const auto split = split_role(slot);
  if (!split) return std::nullopt;
  // "<node>.<gemm>": a gemm name has no '.', and neither part is empty.
  const auto node_gemm = split->first;
  const auto dot = node_gemm.rfind('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == node_gemm.size()) return std::nullopt;
  return split->second;
}

std::optional<std::string> slot_name_from_v1(std::string_view v1_slot) {
  const auto split = split_role(v1_slot);
  if (!split) return std::nullopt;
  return std::string(split->first) + "." + std::string(kV1SlotGemm) + "." +
         std::string(sdk::operand_role_name(split->second));
}

std::string format_float(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", value);
  return buf;
}

}  // namespace mixtrain::fp8
