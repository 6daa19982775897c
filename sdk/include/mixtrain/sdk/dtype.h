// Element types mixtrain knows about.
//
// Contract: every tensor crossing the SDK boundary carries one of these. fp32 is the master /
// accumulation type; tf32 is stored as fp32 but rounded to 10 mantissa bits before a GEMM; fp16,
// bf16 are 2-byte storage types; fp8_e4m3 / fp8_e5m2 are 1-byte OCP FP8 storage types that are
// always paired with a per-tensor scale. int32 carries class labels. Sizes are in bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace mixtrain::sdk {

enum class DType : std::uint8_t { fp32, tf32, fp16, bf16, fp8_e4m3, fp8_e5m2, int32 };

inline constexpr DType kAllDTypes[] = {DType::fp32,     DType::tf32,     DType::fp16, DType::bf16,
                                       DType::fp8_e4m3, DType::fp8_e5m2, DType::int32};

constexpr std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::fp32:
    case DType::tf32:
    case DType::int32:
      return 4;
    case DType::fp16:
    case DType::bf16:
      return 2;
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:
      return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::fp32: return "fp32";
    case DType::tf32: return "tf32";
    case DType::fp16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::fp8_e4m3: return "fp8_e4m3";
    case DType::fp8_e5m2: return "fp8_e5m2";
    case DType::int32: return "int32";
  }
  return "?";
}

constexpr bool is_floating(DType t) noexcept { return t != DType::int32; }
constexpr bool is_fp8(DType t) noexcept { return t == DType::fp8_e4m3 || t == DType::fp8_e5m2; }

// Parses the names printed by dtype_name(); also accepts "float32", "bfloat16", "float16",
// "e4m3", "e5m2". Returns nullopt for anything else.
std::optional<DType> parse_dtype(std::string_view name) noexcept;

}  // namespace mixtrain::sdk
