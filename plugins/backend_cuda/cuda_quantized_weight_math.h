// Per-element math of the quantized weight facet's decode kernels (cuda_quantized_weight.cu),
// callable from host and device so that test_cuda_element_math checks it on the CPU against the
// SDK's reference decoders (sdk/support/nf4.h, sdk/support/block_scaling.h), bit for bit.
//
// Contract
// - NF4: element i's code is the high nibble of byte i / 2 for even i, the low one for odd i
//   (nf4.h's packing); its value is level[code] · absmax, one fp32 product.
// - Block-scaled: element i's code is byte i, or for packed E2M1 the low nibble of byte i / 2 for
//   even i and the high one for odd i (block_scaling.h's pack_e2m1); the code decodes exactly
//   (float_format_rules.h), a block's scale is its fp32 value or its E8M0 / E4M3 scale code
//   decoded exactly; the value is code × scale × tensor scale in double, exact (at most 4 + 24 + 24
//   significant bits), rounded once to fp32: dequantize_block_scaled()'s value.
// - element_of / scale_code_of: the SDK's layout enums as the kernels' tags (host only).
// - Plain C++20 with MIXTRAIN_SDK_HOST_DEVICE functions and no CUDA header (the .cu files build
//   as C++20), so host tests include it as cuda_element_math.h; the caller stores the fp32 value
//   into its storage with that header's encoders.
#pragma once

#include <cstdint>

#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/support/float_format_rules.h"

namespace mixtrain::backend_cuda::quantized {

namespace fr = sdk::format_rules;

MIXTRAIN_SDK_HOST_DEVICE std::uint32_t nf4_code(const std::uint8_t* codes, std::int64_t i) {
  const std::uint32_t byte = codes[i / 2];
  return i % 2 == 0 ? byte >> 4 : byte & 15u;
}

// levels: the 16 NF4 levels (sdk::kNf4Codebook).
MIXTRAIN_SDK_HOST_DEVICE float nf4_value(std::uint32_t code, float absmax, const float* levels) {
  return levels[code] * absmax;
}

// The element formats and the scales' encodings as a kernel reads them: sdk::BlockScale's fp32
// and fp32_pow2 store fp32 values, e8m0 and e8m0_round_up E8M0 bytes, e4m3 E4M3 bytes.
enum class Element : int { e4m3 = 0, e5m2 = 1, e2m1 = 2 };
enum class ScaleCode : int { fp32 = 0, e8m0 = 1, e4m3 = 2 };

inline Element element_of(sdk::BlockElement e) {
  return e == sdk::BlockElement::e4m3   ? Element::e4m3
         : e == sdk::BlockElement::e5m2 ? Element::e5m2
                                        : Element::e2m1;
}
inline ScaleCode scale_code_of(sdk::BlockScale s) {
  switch (s) {
    case sdk::BlockScale::e8m0:
    case sdk::BlockScale::e8m0_round_up:
      return ScaleCode::e8m0;
    case sdk::BlockScale::e4m3:
      return ScaleCode::e4m3;
    default:
      return ScaleCode::fp32;
  }
}

MIXTRAIN_SDK_HOST_DEVICE std::uint32_t element_code(const std::uint8_t* codes, bool packed,
                                                    std::int64_t i) {
  if (!packed) return codes[i];
  const std::uint32_t byte = codes[i / 2];
  return i % 2 == 0 ? byte & 15u : byte >> 4;
}

MIXTRAIN_SDK_HOST_DEVICE float element_value(Element e, std::uint32_t code) {
  switch (e) {
    case Element::e4m3:
      return fr::decode<fr::E4M3>(code);
    case Element::e5m2:
      return fr::decode<fr::E5M2>(code);
    default:
      return fr::decode<fr::E2M1>(code);
  }
}

// Block b's decode scale: scales holds fp32 values (ScaleCode::fp32) or one byte a block.
MIXTRAIN_SDK_HOST_DEVICE float block_scale(const void* scales, ScaleCode kind, std::int64_t b) {
  if (kind == ScaleCode::fp32) return static_cast<const float*>(scales)[b];
  const std::uint32_t code = static_cast<const std::uint8_t*>(scales)[b];
  return kind == ScaleCode::e8m0 ? fr::decode_e8m0(code) : fr::decode<fr::E4M3>(code);
}

MIXTRAIN_SDK_HOST_DEVICE float block_scaled_value(float element, float scale, float tensor_scale) {
  return static_cast<float>(static_cast<double>(element) * static_cast<double>(scale) *
                            static_cast<double>(tensor_scale));
}

}  // namespace mixtrain::backend_cuda::quantized
