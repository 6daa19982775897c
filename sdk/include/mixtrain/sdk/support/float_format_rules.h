// The scalar rules of float_formats.h — round-to-nearest-even encodes from fp32 and exact decodes
// to fp32 for fp16, bf16, tf32, fp8 E4M3 and E5M2 — as inline functions that compile for the host
// and, under nvcc, for the device, so the SDK's conversions and the CUDA kernels are one
// definition.
//
// Contract
// - encode<F>(x, saturate) and decode<F>(code) are float_formats.h's encode_* / decode_* (its
//   contract states the rounding, overflow and NaN rules), bit for bit: float_formats.cpp's scalar
//   functions and its vector kernels' tails call them, and the vector kernels are tested against
//   them. decode_bf16 is decode<Bf16>.
// - Only integer operations and one exact fp32 product (a subnormal's code times a power of two,
//   whose result is a normal fp32): no rounding mode, FTZ / DAZ, FMA contraction or fast-math flag
//   changes a result, on the host or the device.
// - Format descriptors: kE exponent bits, kM mantissa bits, kBias, kMax the largest finite
//   magnitude code, kOverflow the code an overflow gives without saturation (inf, or E4M3's only
//   NaN), kHasInf; the sign sits at bit kE + kM. Tf32 codes are the top 19 bits of an fp32.
// - C++17 and no CUDA header, so nvcc's C++17 .cu files and any host file can include it.
//   MIXTRAIN_SDK_HOST_DEVICE marks a function __host__ __device__ under nvcc, inline elsewhere.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MIXTRAIN_SDK_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MIXTRAIN_SDK_HOST_DEVICE inline
#endif

namespace mixtrain::sdk::format_rules {

using u32 = std::uint32_t;

MIXTRAIN_SDK_HOST_DEVICE u32 bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  u32 u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

MIXTRAIN_SDK_HOST_DEVICE float float_of(u32 u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// |x|'s bit pattern: for non-negative floats integer order is numeric order, and every NaN
// pattern sorts above inf.
MIXTRAIN_SDK_HOST_DEVICE u32 abs_bits(float x) {
  return bits_of(x) & 0x7FFFFFFFu;
}

struct Fp16 {
  static constexpr int kE = 5, kM = 10, kBias = 15;
  static constexpr u32 kMax = 0x7BFF, kOverflow = 0x7C00;
  static constexpr bool kHasInf = true;
};
struct Bf16 {
  static constexpr int kE = 8, kM = 7, kBias = 127;
  static constexpr u32 kMax = 0x7F7F, kOverflow = 0x7F80;
  static constexpr bool kHasInf = true;
};
struct Tf32 {
  static constexpr int kE = 8, kM = 10, kBias = 127;
  static constexpr u32 kMax = 0x3FBFF, kOverflow = 0x3FC00;
  static constexpr bool kHasInf = true;
};
struct E4M3 {
  static constexpr int kE = 4, kM = 3, kBias = 7;
  static constexpr u32 kMax = 0x7E, kOverflow = 0x7F;
  static constexpr bool kHasInf = false;
};
struct E5M2 {
  static constexpr int kE = 5, kM = 2, kBias = 15;
  static constexpr u32 kMax = 0x7B, kOverflow = 0x7C;
  static constexpr bool kHasInf = true;
};

// v >> s rounded to nearest, ties to even. Callers keep v < 2^31 when s > 31, where the result is
// 0 (v is below half an output unit); 32-bit arithmetic is what the device does fastest.
MIXTRAIN_SDK_HOST_DEVICE u32 rne_shift(u32 v, unsigned s) {
  if (s == 0) return v;
  if (s > 31) return 0;
  const u32 q = v >> s, rem = v & ((u32{1} << s) - 1), half = u32{1} << (s - 1);
  return q + ((rem > half || (rem == half && (q & 1u) != 0)) ? 1u : 0u);
}

// Rounds a finite fp32 magnitude `a` (bits) to format F with an unbounded exponent above: the
// result is (biased exponent << kM | mantissa), which exceeds F::kMax exactly when it overflows.
template <class F>
MIXTRAIN_SDK_HOST_DEVICE u32 round_magnitude(u32 a) {
  const u32 e32 = a >> 23, mant = a & 0x7FFFFFu;
  const u32 sig = e32 != 0 ? (mant | 0x800000u) : mant;  // value = sig * 2^(e - 23)
  const int e = e32 != 0 ? static_cast<int>(e32) - 127 : -126;
  constexpr int emin = 1 - F::kBias;
  if (e >= emin) {
    // Normal in F: biased exponent (e + bias) >= 1; sig's implicit bit supplies the last 1, and a
    // rounding carry out of the mantissa correctly bumps the exponent. At most
    // (253 << 23) + 2^24 < 2^31: 32 bits suffice for every format.
    const u32 wide = (static_cast<u32>(e + F::kBias - 1) << 23) + sig;
    return rne_shift(wide, 23 - F::kM);
  }
  // Subnormal in F: units of 2^(emin - kM); reaching 1 << kM is the smallest normal. sig < 2^24.
  return rne_shift(sig, static_cast<unsigned>(23 - F::kM + (emin - e)));
}

// Quiet NaN code keeping the top payload bits (E4M3: always 0x7F).
template <class F>
MIXTRAIN_SDK_HOST_DEVICE u32 nan_code(u32 a) {
  return F::kOverflow | (u32{1} << (F::kM - 1)) | ((a & 0x7FFFFFu) >> (23 - F::kM));
}

// fp32 -> F code, RNE. saturate: overflow and +-inf give +-max finite; else +-inf (E4M3: NaN).
template <class F>
MIXTRAIN_SDK_HOST_DEVICE u32 encode(float x, bool saturate) {
  const u32 bits = bits_of(x);
  const u32 sign = (bits >> 31) << (F::kE + F::kM);
  const u32 a = bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | nan_code<F>(a);
  const u32 overflowed = saturate ? F::kMax : F::kOverflow;
  if (a == 0x7F800000u) return sign | overflowed;
  const u32 c = round_magnitude<F>(a);
  return sign | (c > F::kMax ? overflowed : c);
}

// 2^k for small |k|, as a compile-time constant.
constexpr float pow2(int k) {
  float r = 1.0f;
  for (; k > 0; --k) r *= 2.0f;
  for (; k < 0; ++k) r *= 0.5f;
  return r;
}

// bf16 code -> fp32: the top half of an fp32, a signalling NaN quieted.
MIXTRAIN_SDK_HOST_DEVICE float decode_bf16(std::uint16_t v) {
  u32 f = static_cast<u32>(v) << 16;
  if ((f & 0x7FFFFFFFu) > 0x7F800000u) f |= 0x00400000u;
  return float_of(f);
}

// F code -> fp32, exact; NaNs become quiet fp32 NaNs of the same sign, payload shifted up.
template <class F>
MIXTRAIN_SDK_HOST_DEVICE float decode(u32 v) {
  constexpr u32 kExpAll = (u32{1} << F::kE) - 1, kMantAll = (u32{1} << F::kM) - 1;
  const u32 sign = ((v >> (F::kE + F::kM)) & 1u) << 31;
  const u32 exp = (v >> F::kM) & kExpAll, mant = v & kMantAll;
  bool special;
  if constexpr (F::kHasInf)
    special = exp == kExpAll;
  else
    special = exp == kExpAll && mant == kMantAll;
  if (special) {
    if constexpr (F::kHasInf) {
      if (mant == 0) return float_of(sign | 0x7F800000u);
    }
    return float_of(sign | 0x7FC00000u | (mant << (23 - F::kM)));
  }
  if (exp != 0) return float_of(sign | ((exp + 127 - F::kBias) << 23) | (mant << (23 - F::kM)));
  // Zero or subnormal: mant * 2^(1 - bias - kM), an exact product (a normal fp32, or zero), so no
  // rounding mode or FTZ / DAZ setting changes it.
  constexpr float kUnit = pow2(1 - F::kBias - F::kM);
  return float_of(sign | bits_of(static_cast<float>(mant) * kUnit));
}

template <>
MIXTRAIN_SDK_HOST_DEVICE float decode<Bf16>(u32 v) {
  return decode_bf16(static_cast<std::uint16_t>(v));
}

}  // namespace mixtrain::sdk::format_rules
