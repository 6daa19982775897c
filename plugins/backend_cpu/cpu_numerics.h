// Scalar floating-point format conversions of the CPU backend (the numerical reference).
//
// Contract
// - Every narrowing conversion rounds to nearest, ties to even (RNE) and handles subnormals of
//   the target format exactly. It is integer arithmetic on the bit patterns, except fp16
//   subnormals, which use one fp32 addition and so assume the default rounding mode (nothing in
//   mixtrain changes it); FTZ/DAZ do not affect the result.
// - Overflow: without `saturate` a finite value beyond the format's range becomes ±inf; with
//   `saturate` it (and ±inf) becomes ±largest finite (the PTX `.satfinite` rule). NaN stays NaN:
//   a quiet NaN with the input's sign and the top payload bits that fit; decodes give quiet
//   NaNs too (the rules sdk/float_formats.h states).
// - tf32: fp32 storage with the mantissa rounded to 10 bits; inf passes through unchanged.
// - Header-only and inline so the element-wise loops that call these can be vectorised.
#pragma once

#include <bit>
#include <cstdint>

namespace mixtrain::backend_cpu {

// Storage types of the 16-bit formats; distinct types so templates can dispatch on them.
struct Bf16 {
  std::uint16_t bits;
};
struct Fp16 {
  std::uint16_t bits;
};

inline constexpr std::uint16_t kBf16MaxFinite = 0x7F7F;
inline constexpr std::uint16_t kFp16MaxFinite = 0x7BFF;

inline float bf16_to_float(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return std::bit_cast<float>(nan ? (u | 0x00400000u) : u);  // NaN decodes quiet
}

// Branch-free (selects only) so loops that store bf16 vectorise.
inline std::uint16_t float_to_bf16(float f, bool saturate = false) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign16 = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7FFFFFFFu;
  // RNE on the 16 dropped bits; inf stays inf (0x7F80) and overflow carries into inf.
  std::uint32_t r = (abs + 0x7FFFu + ((abs >> 16) & 1u)) >> 16;
  r = (saturate && r >= 0x7F80u) ? kBf16MaxFinite : r;
  r = abs > 0x7F800000u ? ((abs >> 16) | 0x0040u) : r;  // NaN: quiet, top payload bits kept
  return static_cast<std::uint16_t>(sign16 | r);
}

// Branch-free (selects only) so loops that load fp16 vectorise.
inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t mant = h & 0x3FFu;
  const std::uint32_t normal = sign | ((exp + 112u) << 23) | (mant << 13);
  // inf, or NaN decoded quiet with its payload
  const std::uint32_t inf_nan = sign | 0x7F800000u | (mant != 0 ? 0x00400000u : 0u) | (mant << 13);
  // zero / subnormal: mant * 2^-24, exact in fp32
  const std::uint32_t subnormal =
      sign | std::bit_cast<std::uint32_t>(static_cast<float>(mant) * 5.9604644775390625e-8f);
  return std::bit_cast<float>(exp == 0x1Fu ? inf_nan : (exp != 0 ? normal : subnormal));
}

// Branch-free (selects only) so loops that store fp16 vectorise.
inline std::uint16_t float_to_fp16(float f, bool saturate = false) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign16 = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7FFFFFFFu;
  // Normal in fp16 (|f| >= 2^-14): rebias the exponent and round the 13 dropped bits; a mantissa
  // carry correctly bumps the exponent.
  const std::uint32_t rebased = abs - (112u << 23);
  const std::uint32_t normal = (rebased + 0xFFFu + ((rebased >> 13) & 1u)) >> 13;
  // Subnormal in fp16: the ulp of 0.5f is 2^-24, the fp16 subnormal unit, so the fp32 addition
  // |f| + 0.5 rounds |f| to that unit with IEEE round-to-nearest-even (the default mode; FTZ/DAZ
  // cannot interfere because |f| + 0.5 is normal, and fp32 subnormal inputs rightly give 0).
  const std::uint32_t subnormal =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(abs) + 0.5f) - 0x3F000000u;
  std::uint32_t r = abs < (113u << 23) ? subnormal : normal;
  r = abs >= 0x477FF000u ? (saturate ? kFp16MaxFinite : 0x7C00u) : r;  // >= 65520 and inf
  r = abs > 0x7F800000u ? (0x7E00u | ((abs >> 13) & 0x3FFu)) : r;  // NaN: quiet, payload top bits
  return static_cast<std::uint16_t>(sign16 | r);
}

inline float round_to_tf32(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7FFFFFFFu) == 0x7F800000u) return f;  // inf unchanged
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)                // NaN: quiet, top payload bits kept
    return std::bit_cast<float>((u | 0x00400000u) & ~0x1FFFu);
  const std::uint32_t rounded = (u + 0xFFFu + ((u >> 13) & 1u)) & ~0x1FFFu;
  return std::bit_cast<float>(rounded);
}

// Uniform load/store so kernels can be written once over the storage type.
inline float to_float(float v) { return v; }
inline float to_float(Bf16 v) { return bf16_to_float(v.bits); }
inline float to_float(Fp16 v) { return fp16_to_float(v.bits); }

template <class T>
inline T from_float(float v, bool saturate = false);
template <>
inline float from_float<float>(float v, bool) {
  return v;
}
template <>
inline Bf16 from_float<Bf16>(float v, bool saturate) {
  return Bf16{float_to_bf16(v, saturate)};
}
template <>
inline Fp16 from_float<Fp16>(float v, bool saturate) {
  return Fp16{float_to_fp16(v, saturate)};
}

inline bool is_finite_bits(float v) {
  return (std::bit_cast<std::uint32_t>(v) & 0x7F800000u) != 0x7F800000u;
}

}  // namespace mixtrain::backend_cpu
