// Exact conversions between fp32 and the narrow floating-point storage formats.
//
// Contract (every backend and policy relies on these numbers being the hardware's numbers):
//
// Formats. fp16 = IEEE binary16 (1.5.10, bias 15, max 65504, inf/NaN). bf16 = 1.8.7 (bias 127,
// max (2-2^-7)·2^127, inf/NaN). tf32 = fp32 storage with the low 13 mantissa bits rounded away
// (1.8.10). fp8_e4m3 = OCP 8-bit FP E4M3 (bias 7, max 448, subnormal unit 2^-9, no infinities,
// NaN is S.1111.111 only). fp8_e5m2 = OCP E5M2 (bias 15, max 57344, subnormal unit 2^-16,
// IEEE-like: S.11111.00 is inf, S.11111.{01,10,11} NaN).
//
// Encodes (fp32 -> narrow) are correctly rounded, round-to-nearest-even, on the exact fp32 input:
// target subnormals are produced exactly (gradual underflow) and fp32 subnormal inputs are honoured
// (they matter for bf16 and tf32, which share fp32's exponent range; for fp16/fp8 they round to a
// signed zero). −0 stays −0. The sign of a result that rounds to zero is kept. The implementation
// is pure integer arithmetic: neither MXCSR rounding mode nor FTZ/DAZ affect the scalar encodes.
//
// Overflow. A finite input overflows when its rounded magnitude (RNE with unbounded exponent)
// exceeds the largest finite value. The first overflowing magnitudes are the midpoints above max:
//   fp16  >= 65520                  (ties to even: 65520 -> 65536)
//   bf16  >= (2-2^-8)·2^127          (fp32 bits 0x7F7F8000)
//   tf32  >= (2-2^-11)·2^127         (fp32 bits 0x7F7FF000)
//   e5m2  >= 61440                  (ties to even: 61440 -> 65536)
//   e4m3  >  464                    (464 is a tie and rounds to even 448; anything above -> 480)
// Overflow::saturate clamps overflowing values and ±inf to ±max finite. Overflow::to_inf_or_nan
// gives ±inf (fp16, bf16, tf32, e5m2) or NaN of that sign (e4m3, which has no inf); ±inf inputs give
// ±inf (e4m3: NaN). NaN inputs always give a quiet NaN of the same sign in both modes, keeping the
// top payload bits that fit (e4m3: S.1111.111).
//
// Decodes (narrow -> fp32) are exact: every narrow value is representable in fp32. NaNs decode to
// quiet fp32 NaNs of the same sign with the payload shifted up (what F16C's vcvtph2ps does).
//
// The microscaling formats (OCP Microscaling Formats (MX) v1.0), with ml_dtypes' float4_e2m1fn and
// float8_e8m0fnu as the reference they match bit for bit (tests/unit/sdk/formats):
// - fp4_e2m1 = 1.2.1, bias 1: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}, no inf, no NaN. One code per byte,
//   in the low nibble (sign at bit 3); decodes ignore the high nibble. Encodes round to nearest
//   even (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 5 -> 4), keep the sign of zero, and always saturate:
//   anything above 6 in magnitude, ±inf included, gives ±6. A NaN gives the zero of the opposite
//   sign (+NaN -> 0x8, -NaN -> 0x0): the MX spec leaves NaN to the implementation, and this is
//   ml_dtypes' choice.
// - e8m0 = 8 exponent bits, bias 127, unsigned: 2^-127 … 2^127, code 0xFF is NaN; no zero, inf
//   or sign. It is the MX block-scale format. Encodes round to the nearer power of two with ties
//   upwards (3 -> 4, 1.5 -> 2, 0.3 -> 0.25), and NaN, ±inf, ±0, negative inputs and x >= 1.5·2^127
//   give NaN; fp32 subnormals give 2^-127 up to 2^-127 itself and 2^-126 above it
//   (float_format_rules.h, encode_e8m0, states the rule in full).
//
// Bulk functions compute exactly what the scalar functions compute, element by element, bit for bit;
// at run time they pick the widest instruction set the CPU offers (F16C, AVX2, AVX-512,
// AVX512-BF16), never assuming one. Optional scaling is one fp32 multiply per element before
// encoding (x·scale, rounded to fp32 under the current FP environment, then encoded) or after
// decoding (value·scale_inv); a scale of exactly 1 skips the multiply. amax receives max|src| over
// the *unscaled* input (0 for an empty span; NaN if any element is NaN; inf if any is ±inf). Spans
// must have equal sizes and the dtype must fit the element width, otherwise std::invalid_argument
// is thrown and nothing is written.
#pragma once

#include <cstdint>
#include <span>

#include "mixtrain/sdk/dtype.h"

namespace mixtrain::sdk {

// What an encode does with magnitudes above the target's largest finite value.
enum class Overflow : std::uint8_t { saturate, to_inf_or_nan };

// Largest finite values, as bit patterns of the positive encoding.
inline constexpr std::uint16_t kFp16MaxBits = 0x7BFF;  // 65504
inline constexpr std::uint16_t kBf16MaxBits = 0x7F7F;  // 3.3895314e38
inline constexpr std::uint8_t kFp8E4M3MaxBits = 0x7E;  // 448
inline constexpr std::uint8_t kFp8E5M2MaxBits = 0x7B;  // 57344
inline constexpr std::uint8_t kFp4E2M1MaxBits = 0x7;   // 6
inline constexpr std::uint8_t kE8M0NanBits = 0xFF;     // E8M0's only special code

// ---- Scalar reference conversions -------------------------------------------------------------
std::uint16_t encode_fp16(float x, Overflow overflow = Overflow::to_inf_or_nan) noexcept;
float decode_fp16(std::uint16_t bits) noexcept;

std::uint16_t encode_bf16(float x, Overflow overflow = Overflow::to_inf_or_nan) noexcept;
float decode_bf16(std::uint16_t bits) noexcept;

// fp8 has no conventional default: callers must say whether they want saturation.
std::uint8_t encode_fp8_e4m3(float x, Overflow overflow) noexcept;
float decode_fp8_e4m3(std::uint8_t bits) noexcept;

std::uint8_t encode_fp8_e5m2(float x, Overflow overflow) noexcept;
float decode_fp8_e5m2(std::uint8_t bits) noexcept;

// Saturating always (fp4 has neither inf nor NaN); the code is in the low nibble.
std::uint8_t encode_fp4_e2m1(float x) noexcept;
float decode_fp4_e2m1(std::uint8_t bits) noexcept;

// Non-saturating, as ml_dtypes: what E8M0 cannot hold is NaN (0xFF).
std::uint8_t encode_e8m0(float x) noexcept;
float decode_e8m0(std::uint8_t bits) noexcept;

// fp32 -> fp32 rounded to 10 mantissa bits (RNE; note CUDA's cvt.rna.tf32.f32 rounds ties away).
float round_to_tf32(float x, Overflow overflow = Overflow::to_inf_or_nan) noexcept;

// ---- Bulk conversions -------------------------------------------------------------------------
struct EncodeOptions {
  float scale = 1.0f;                        // multiplies src before rounding
  Overflow overflow = Overflow::to_inf_or_nan;
  float* amax = nullptr;                     // if set, receives max|src| (unscaled, NaN-aware)
};

// fp32 -> fp16 / bf16 (`to` must be DType::fp16 or DType::bf16).
void convert(std::span<const float> src, std::span<std::uint16_t> dst, DType to,
                              const EncodeOptions& options = {});
// fp32 -> fp8 (`to` must be DType::fp8_e4m3 or DType::fp8_e5m2).
void convert(std::span<const float> src, std::span<std::uint8_t> dst, DType to,
                              const EncodeOptions& options);
// fp16 / bf16 -> fp32, each value multiplied by scale_inv.
void convert(std::span<const std::uint16_t> src, DType from, std::span<float> dst,
                              float scale_inv = 1.0f);
// fp8 -> fp32, each value multiplied by scale_inv.
void convert(std::span<const std::uint8_t> src, DType from, std::span<float> dst,
                              float scale_inv = 1.0f);
// In place: every element becomes round_to_tf32(element, overflow).
void round_to_tf32(std::span<float> data,
                                    Overflow overflow = Overflow::to_inf_or_nan) noexcept;
// max|x| over data with the amax rules above, without converting anything.
float abs_max(std::span<const float> data) noexcept;

// ---- Instruction-set selection (tests and benchmarks) ----------------------------------------
// Tiers the bulk functions may use, each including the ones before: avx2 = AVX2 + F16C, avx512 =
// AVX-512F/BW/VL, avx512bf16 = avx512 plus vcvtneps2bf16 for fp32->bf16. Every tier yields
// identical bits.
enum class ConversionIsa : std::uint8_t { scalar, avx2, avx512, avx512bf16 };

// The best tier this CPU (and OS) supports.
ConversionIsa supported_conversion_isa() noexcept;
// Caps the tier used from now on (clamped to what is supported); returns the tier now in effect.
// Process-wide; meant for tests and benchmarks, not for concurrent use with conversions.
ConversionIsa limit_conversion_isa(ConversionIsa cap) noexcept;
// The tier in effect.
ConversionIsa active_conversion_isa() noexcept;
// Human-readable: which instructions each bulk conversion uses now, e.g. for logs.
const char* conversion_paths() noexcept;

}  // namespace mixtrain::sdk
