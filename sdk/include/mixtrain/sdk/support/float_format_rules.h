// The scalar rules of float_formats.h — round-to-nearest-even encodes from fp32 and exact decodes
// to fp32 for fp16, bf16, tf32, fp8 E4M3 and E5M2, fp4 E2M1 and the E8M0 scale format — as inline
// functions that compile for the host and, under nvcc, for the device, so the SDK's conversions
// and the CUDA kernels are one definition. Beside them, the integer rules a block-scaled encoding
// (block_scaling.h) needs on both sides: an encode of x·2^k rounded once, stochastic rounding
// with counter-based random bits, and the two power-of-two (E8M0) block-scale rules.
//
// Contract
// - encode<F>(x, saturate) and decode<F>(code) are float_formats.h's encode_* / decode_* (its
//   contract states the rounding, overflow and NaN rules), bit for bit: float_formats.cpp's scalar
//   functions and its vector kernels' tails call them, and the vector kernels are tested against
//   them. decode_bf16 is decode<Bf16>; encode_e8m0 / decode_e8m0 are float_formats.h's.
// - int32_toward_zero(x): fp32 -> int32 toward zero, saturating, NaN 0 (a plain cast is undefined
//   out of range); what CUDA's cvt.rzi.s32.f32 does, so both backends' int32 fill is this.
// - Only integer operations, exact comparisons and one exact fp32 product (a subnormal's code
//   times a power of two, whose result is a normal fp32): no rounding mode, FTZ / DAZ, FMA
//   contraction or fast-math flag changes a result, on the host or the device. The exception is the
//   last section, FP8 block scaling's fp32 scale rule, which is fp32 division and multiplication by
//   its definition.
// - Format descriptors: kE exponent bits, kM mantissa bits, kBias, kMax the largest finite
//   magnitude code, kOverflow the code an overflow gives without saturation (inf, or E4M3's only
//   NaN; E2M1, which has neither, saturates), kHasInf, kHasNan; the sign sits at bit kE + kM.
//   Tf32 codes are the top 19 bits of an fp32. E8M0 (unsigned, exponent only) has its own
//   functions.
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

MIXTRAIN_SDK_HOST_DEVICE std::int32_t int32_toward_zero(float x) {
  if (!(x == x)) return 0;
  if (x >= 2147483648.0f) return INT32_MAX;
  if (x <= -2147483648.0f) return INT32_MIN;
  return static_cast<std::int32_t>(x);
}

struct Fp16 {
  static constexpr int kE = 5, kM = 10, kBias = 15;
  static constexpr u32 kMax = 0x7BFF, kOverflow = 0x7C00;
  static constexpr bool kHasInf = true, kHasNan = true;
};
struct Bf16 {
  static constexpr int kE = 8, kM = 7, kBias = 127;
  static constexpr u32 kMax = 0x7F7F, kOverflow = 0x7F80;
  static constexpr bool kHasInf = true, kHasNan = true;
};
struct Tf32 {
  static constexpr int kE = 8, kM = 10, kBias = 127;
  static constexpr u32 kMax = 0x3FBFF, kOverflow = 0x3FC00;
  static constexpr bool kHasInf = true, kHasNan = true;
};
struct E4M3 {
  static constexpr int kE = 4, kM = 3, kBias = 7;
  static constexpr u32 kMax = 0x7E, kOverflow = 0x7F;
  static constexpr bool kHasInf = false, kHasNan = true;
};
struct E5M2 {
  static constexpr int kE = 5, kM = 2, kBias = 15;
  static constexpr u32 kMax = 0x7B, kOverflow = 0x7C;
  static constexpr bool kHasInf = true, kHasNan = true;
};
// OCP MX fp4: values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}; every code is finite, so an overflow (and an
// infinity) can only saturate to ±6.
struct E2M1 {
  static constexpr int kE = 2, kM = 1, kBias = 1;
  static constexpr u32 kMax = 0x7, kOverflow = 0x7;
  static constexpr bool kHasInf = false, kHasNan = false;
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

// F's code for a NaN input (bits). With a NaN in F: nan_code of the same sign. E2M1 has none, and
// follows ml_dtypes' float4_e2m1fn (the OCP MX spec leaves it to the implementation): the zero of
// the opposite sign, +NaN -> 0x8 (-0), -NaN -> 0x0 (+0).
template <class F>
MIXTRAIN_SDK_HOST_DEVICE u32 nan_input_code(u32 bits) {
  const u32 sign = (bits >> 31) << (F::kE + F::kM);
  if constexpr (F::kHasNan)
    return sign | nan_code<F>(bits & 0x7FFFFFFFu);
  else
    return sign ^ (u32{1} << (F::kE + F::kM));
}

// fp32 -> F code, RNE. saturate: overflow and +-inf give +-max finite; else +-inf (E4M3: NaN;
// E2M1: max, it saturates either way).
template <class F>
MIXTRAIN_SDK_HOST_DEVICE u32 encode(float x, bool saturate) {
  const u32 bits = bits_of(x);
  const u32 sign = (bits >> 31) << (F::kE + F::kM);
  const u32 a = bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return nan_input_code<F>(bits);
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

// F code -> fp32, exact; NaNs become quiet fp32 NaNs of the same sign, payload shifted up. Bits
// above the sign are ignored (an E2M1 code is the low nibble of its byte).
template <class F>
MIXTRAIN_SDK_HOST_DEVICE float decode(u32 v) {
  constexpr u32 kExpAll = (u32{1} << F::kE) - 1, kMantAll = (u32{1} << F::kM) - 1;
  const u32 sign = ((v >> (F::kE + F::kM)) & 1u) << 31;
  const u32 exp = (v >> F::kM) & kExpAll, mant = v & kMantAll;
  bool special = false;
  if constexpr (F::kHasInf)
    special = exp == kExpAll;
  else if constexpr (F::kHasNan)
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

// ---- E8M0: the OCP MX scale format ---------------------------------------------------------
// Unsigned, exponent only: code c is 2^(c - 127) for c in 0..254 (2^-127 is an fp32 subnormal),
// 0xFF is NaN; no zero, no infinity, no sign.
inline constexpr u32 kE8M0Nan = 0xFF;
inline constexpr int kE8M0Bias = 127;

// fp32 -> E8M0 exactly as ml_dtypes' float8_e8m0fnu converts (non-saturating):
// - NaN, +-inf, +-0 and every negative number give NaN (0xFF): the format has none of them;
// - a normal x = 2^e·(1 + f) rounds to the nearer power of two, a tie (f = 1/2) upwards: 2^e when
//   f < 1/2, else 2^(e+1) (3 -> 4, 1.5 -> 2, 0.3 -> 0.25); 2^128 and above (x >= 1.5·2^127) is NaN;
// - fp32 subnormals: (0, 2^-127] -> 2^-127 (code 0), (2^-127, 2^-126) -> 2^-126 (code 1). Note
//   (2^-127, 1.5·2^-127) is nearer 2^-127: ml_dtypes rounds these on a linear grid of step 2^-126
//   (ties to even), and this rule matches it bit for bit.
MIXTRAIN_SDK_HOST_DEVICE u32 encode_e8m0(float x) {
  const u32 b = bits_of(x);
  // One unsigned compare catches +inf, +NaN and anything with the sign bit set.
  if (b >= 0x7F800000u || b == 0) return kE8M0Nan;
  const u32 e = b >> 23, m = b & 0x7FFFFFu;
  if (e == 0) return m > 0x400000u ? 1u : 0u;
  return e + (m >= 0x400000u ? 1u : 0u);  // 254 + 1 = 0xFF: the overflow is NaN
}

// E8M0 code (low 8 bits of v) -> fp32, exact.
MIXTRAIN_SDK_HOST_DEVICE float decode_e8m0(u32 v) {
  v &= 0xFFu;
  if (v == kE8M0Nan) return float_of(0x7FC00000u);
  return float_of(v == 0 ? 0x00400000u : v << 23);
}

// ---- Scaled encodes and stochastic rounding ------------------------------------------------

// A finite non-zero fp32 magnitude `a` (bits) as sig·2^(e - 23) with sig in [2^23, 2^24): fp32
// subnormals are normalised, so a later shift of the exponent keeps every bit.
MIXTRAIN_SDK_HOST_DEVICE void normalise(u32 a, u32& sig, int& e) {
  const u32 e32 = a >> 23;
  sig = a & 0x7FFFFFu;
  if (e32 != 0) {
    sig |= 0x800000u;
    e = static_cast<int>(e32) - 127;
    return;
  }
  e = -126;
  while ((sig & 0x800000u) == 0) {  // at most 23 steps, subnormal inputs only
    sig <<= 1;
    --e;
  }
}

// floor(log2 a) of a finite non-zero fp32 magnitude (bits): -149 .. 127.
MIXTRAIN_SDK_HOST_DEVICE int floor_log2(u32 a) {
  u32 sig;
  int e;
  normalise(a, sig, e);
  return e;
}

// v >> s rounded stochastically: up with probability rem / 2^s (rem = the bits shifted out) when
// s <= 32, exactly; for s > 32, v < 2^32 and the probability is rem / 2^s truncated to a multiple
// of 2^-32. rbits must be 32 uniform random bits; a value already on the grid (rem = 0) never
// moves.
MIXTRAIN_SDK_HOST_DEVICE u32 stochastic_shift(u32 v, unsigned s, u32 rbits) {
  if (s == 0) return v;
  if (s >= 32) {
    const u32 threshold = s - 32 >= 32 ? 0u : v >> (s - 32);
    return rbits < threshold ? 1u : 0u;
  }
  const u32 q = v >> s, rem = v & ((u32{1} << s) - 1);
  return q + (rbits < (rem << (32 - s)) ? 1u : 0u);  // rem·2^(32-s) < 2^32: the exact threshold
}

// |x|·2^k for a finite non-zero fp32 magnitude `a` (bits), rounded once to F's grid with an
// unbounded exponent above (as round_magnitude: a result above F::kMax is an overflow): to
// nearest even, or stochastically with rbits. Exact for every k: nothing is rounded before F's.
// Callers keep |k| < 2^24.
template <class F, bool kStochastic>
MIXTRAIN_SDK_HOST_DEVICE u32 round_scaled_magnitude(u32 a, int k, u32 rbits) {
  u32 sig;
  int e;
  normalise(a, sig, e);
  e += k;
  constexpr int emin = 1 - F::kBias;
  if (e >= emin) {
    // Beyond biased exponent 254 every format has overflowed; capping there keeps the sum below
    // 2^32 (254 << 23 plus sig < 2^24).
    if (e + F::kBias - 1 > 254) return ~u32{0};
    const u32 wide = (static_cast<u32>(e + F::kBias - 1) << 23) + sig;
    if constexpr (kStochastic)
      return stochastic_shift(wide, 23 - F::kM, rbits);
    else
      return rne_shift(wide, 23 - F::kM);
  }
  const int s = 23 - F::kM + (emin - e);  // > 23 - kM; huge when x·2^k is far below F's range
  const unsigned shift = s > 63 ? 63u : static_cast<unsigned>(s);
  if constexpr (kStochastic)
    return stochastic_shift(sig, shift, rbits);
  else
    return rne_shift(sig, shift);
}

template <class F, bool kStochastic>
MIXTRAIN_SDK_HOST_DEVICE u32 encode_scaled_impl(float x, int k, bool saturate, u32 rbits) {
  const u32 bits = bits_of(x);
  const u32 sign = (bits >> 31) << (F::kE + F::kM);
  const u32 a = bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return nan_input_code<F>(bits);
  const u32 overflowed = saturate ? F::kMax : F::kOverflow;
  if (a == 0x7F800000u) return sign | overflowed;
  if (a == 0) return sign;
  const u32 c = round_scaled_magnitude<F, kStochastic>(a, k, rbits);
  return sign | (c > F::kMax ? overflowed : c);
}

// The F code of x·2^k, the product never rounded on its own (so x·2^k may lie outside fp32's
// range): encode<F>(x, saturate) for k = 0, and the element encode of a block with a power-of-two
// scale 2^-k. NaN, inf and overflow as encode<F>.
template <class F>
MIXTRAIN_SDK_HOST_DEVICE u32 encode_scaled(float x, int k, bool saturate) {
  return encode_scaled_impl<F, false>(x, k, saturate, 0);
}

// encode_scaled with stochastic rounding: between the two codes around |x|·2^k, the larger with
// probability equal to the distance from the smaller over their gap (stochastic_shift), given 32
// uniform random bits. A value beyond max can round past it, and then overflows as encode<F>.
template <class F>
MIXTRAIN_SDK_HOST_DEVICE u32 encode_scaled_stochastic(float x, int k, bool saturate, u32 rbits) {
  return encode_scaled_impl<F, true>(x, k, saturate, rbits);
}

// 32 random bits for element `index` of the stream `seed`: SplitMix64's output function at state
// seed + (index + 1)·0x9E3779B97F4A7C15. Counter-based, so the host and a kernel draw the same
// bits for an element whatever order they visit it in.
MIXTRAIN_SDK_HOST_DEVICE u32 random_bits(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<u32>(z >> 32);
}

// ---- Power-of-two (E8M0) block scales ------------------------------------------------------

// floor(log2 of F's largest finite value): the OCP MX spec's emax_elem (E4M3 8, E5M2 15, E2M1 2).
template <class F>
constexpr int emax_elem() {
  return static_cast<int>(F::kMax >> F::kM) - F::kBias;
}

// The OCP MX shared exponent of a block whose largest magnitude is amax (finite, bits):
// floor(log2 amax) - emax_elem, clamped to E8M0's [-127, 127]; amax 0 gives -127. Elements
// x / 2^k then keep amax's exponent at F's top, and those between F's max and 2^(emax_elem + 1)
// saturate (OCP Microscaling Formats (MX) v1.0, section 6.3).
template <class F>
MIXTRAIN_SDK_HOST_DEVICE int mx_scale_exponent_floor(u32 amax) {
  if (amax == 0) return -kE8M0Bias;
  const int k = floor_log2(amax) - emax_elem<F>();
  return k < -kE8M0Bias ? -kE8M0Bias : (k > kE8M0Bias ? kE8M0Bias : k);
}

// The smallest k with amax <= F's max·2^k (amax finite, bits), clamped to [-127, 127]; amax 0
// gives -127. No element of the block saturates. Transformer Engine's MXFP8 rounds amax·(1/max),
// computed in fp32, up to a power of two; for normal amax that is this k.
template <class F>
MIXTRAIN_SDK_HOST_DEVICE int mx_scale_exponent_round_up(u32 amax) {
  if (amax == 0) return -kE8M0Bias;
  u32 sig;
  int e;
  normalise(amax, sig, e);
  // F's max is max_sig·2^(emax_elem - kM) with max_sig in [2^kM, 2^(kM+1)); compare significands
  // on one scale: amax / 2^e = sig / 2^23 against max / 2^emax_elem = max_sig / 2^kM.
  constexpr u32 max_sig = (u32{1} << F::kM) | (F::kMax & ((u32{1} << F::kM) - 1));
  const bool above =
      (static_cast<std::uint64_t>(sig) << F::kM) > (static_cast<std::uint64_t>(max_sig) << 23);
  const int k = e - emax_elem<F>() + (above ? 1 : 0);
  return k < -kE8M0Bias ? -kE8M0Bias : (k > kE8M0Bias ? kE8M0Bias : k);
}

// ---- FP8 block scaling's fp32 block scales (block_scaling.h) -------------------------------
// The only rules here with fp32 arithmetic: each step is one IEEE operation rounded to nearest
// even, spelled with the round-to-nearest intrinsics on the device so no compiler flag (fast
// math, FMA contraction) changes it; on the host the callers build without contraction. Both
// assume no FTZ / DAZ (a decode scale 1 / s can be an fp32 subnormal).

MIXTRAIN_SDK_HOST_DEVICE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

MIXTRAIN_SDK_HOST_DEVICE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// The encode scale s of a block whose largest magnitude is amax (finite, >= 0), for elements
// whose largest finite value is max_elem: s = max_elem / amax; amax 0 gives 1 and an infinite
// quotient FLT_MAX; pow2 then rounds s down to a power of two by clearing its mantissa (s >=
// 448 / FLT_MAX is a normal fp32, so that is 2^floor(log2 s)).
MIXTRAIN_SDK_HOST_DEVICE float fp32_block_encode_scale(float amax, float max_elem, bool pow2) {
  if (amax == 0.0f) return 1.0f;
  float s = div_rn(max_elem, amax);
  if (bits_of(s) == 0x7F800000u) s = float_of(0x7F7FFFFFu);
  if (pow2) s = float_of(bits_of(s) & 0xFF800000u);
  return s;
}

// The stored (decode) scale of a block encoded with s: 1 / s.
MIXTRAIN_SDK_HOST_DEVICE float fp32_block_decode_scale(float s) {
  return div_rn(1.0f, s);
}

// The value a block-scaled element encodes: x · encode_scale as one fp32 product, x itself when
// the scale is 1 (a zero block, MX's power-of-two path).
MIXTRAIN_SDK_HOST_DEVICE float block_scaled_value(float x, float encode_scale) {
  return encode_scale == 1.0f ? x : mul_rn(x, encode_scale);
}

// ---- NVFP4's two-level scales (block_scaling.h) --------------------------------------------
// fp32 arithmetic as the section above (one IEEE operation per step, round to nearest even).
// Level one, per tensor: S_enc = 6 · 448 / amax over the finite blocks (1 for amax 0, FLT_MAX for
// an infinite quotient), stored as S_dec = 1 / S_enc. Level two, per block: the E4M3 code of
// amax_block · (S_enc · (1/6)) (1/6 folded into S_enc as the kernels do), and the elements of a
// block scaled by 1 / (that E4M3 value · S_dec), at most FLT_MAX, 0 for a zero scale.

MIXTRAIN_SDK_HOST_DEVICE float nvfp4_tensor_encode_scale(float global_amax) {
  if (global_amax == 0.0f) return 1.0f;
  const float s = div_rn(6.0f * 448.0f, global_amax);
  return bits_of(s) == 0x7F800000u ? float_of(0x7F7FFFFFu) : s;
}

MIXTRAIN_SDK_HOST_DEVICE float nvfp4_tensor_decode_scale(float tensor_encode_scale) {
  return div_rn(1.0f, tensor_encode_scale);
}

MIXTRAIN_SDK_HOST_DEVICE u32 nvfp4_block_scale_code(float block_amax, float tensor_encode_scale) {
  return encode<E4M3>(mul_rn(block_amax, mul_rn(tensor_encode_scale, 1.0f / 6.0f)), true);
}

MIXTRAIN_SDK_HOST_DEVICE float nvfp4_block_encode_scale(float block_decode_scale,
                                                        float tensor_decode_scale) {
  if (block_decode_scale == 0.0f) return 0.0f;
  const float q = div_rn(1.0f, mul_rn(block_decode_scale, tensor_decode_scale));
  return bits_of(q) == 0x7F800000u ? float_of(0x7F7FFFFFu) : q;
}

}  // namespace mixtrain::sdk::format_rules
