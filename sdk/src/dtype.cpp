#include "mixtrain/sdk/dtype.h"

namespace mixtrain::sdk {

std::optional<DType> parse_dtype(std::string_view n) noexcept {
  if (n == "fp32" || n == "float32") return DType::fp32;
  if (n == "tf32") return DType::tf32;
  if (n == "fp16" || n == "float16" || n == "half") return DType::fp16;
  if (n == "bf16" || n == "bfloat16") return DType::bf16;
  if (n == "fp8_e4m3" || n == "e4m3") return DType::fp8_e4m3;
  if (n == "fp8_e5m2" || n == "e5m2") return DType::fp8_e5m2;
  if (n == "int32") return DType::int32;
  return std::nullopt;
}

}  // namespace mixtrain::sdk
