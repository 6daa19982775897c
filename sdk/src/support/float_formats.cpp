// Scalar reference conversions, their vectorised twins, and run-time ISA dispatch.
//
// The scalar rules (float_format_rules.h, shared with the CUDA kernels) are the definition; every
// vector kernel below must reproduce them bit for bit (tests/unit/sdk/formats checks each tier
// against them). Encodes are integer arithmetic on the fp32 bit pattern, so the MXCSR rounding
// mode and FTZ/DAZ never change one.
#include "mixtrain/sdk/support/float_formats.h"

#include "mixtrain/sdk/support/float_format_rules.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#define MIXTRAIN_FORMATS_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define MIXTRAIN_FORMATS_X86 0
#endif

namespace mixtrain::sdk {
namespace {

using u32 = std::uint32_t;

// The formats and their scalar rules are float_format_rules.h's, shared with the CUDA kernels.
using format_rules::abs_bits;
using format_rules::Bf16;
using format_rules::E2M1;
using format_rules::E4M3;
using format_rules::E5M2;
using format_rules::Fp16;
using format_rules::Tf32;

template <class F>
u32 encode_scalar(float x, Overflow ov) {
  return format_rules::encode<F>(x, ov == Overflow::saturate);
}

template <class F>
float decode_scalar(u32 v) {
  return format_rules::decode<F>(v);
}

// ---- Scalar bulk kernels: the reference tier, and the tails of the vector loops ---------------
// amax is accumulated as the maximum of |x|'s bit pattern: for non-negative floats integer order
// is numeric order, and every NaN pattern sorts above inf, so a NaN anywhere wins.
template <class F, class Out>
void encode_loop(const float* src, Out* dst, std::size_t n, float scale, Overflow ov, u32* amax) {
  u32 m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float x = src[i];
    m = std::max(m, abs_bits(x));
    dst[i] = static_cast<Out>(encode_scalar<F>(scale == 1.0f ? x : x * scale, ov));
  }
  if (amax != nullptr) *amax = std::max(*amax, m);
}

template <class F, class In>
void decode_loop(const In* src, float* dst, std::size_t n, float scale_inv) {
  for (std::size_t i = 0; i < n; ++i) {
    const float v = decode_scalar<F>(src[i]);
    dst[i] = scale_inv == 1.0f ? v : v * scale_inv;
  }
}

void fp8_decode_loop(const std::uint8_t* src, float* dst, std::size_t n, float scale_inv,
                     const float* table) {
  for (std::size_t i = 0; i < n; ++i) {
    const float v = table[src[i]];
    dst[i] = scale_inv == 1.0f ? v : v * scale_inv;
  }
}

void tf32_loop(float* data, std::size_t n, Overflow ov) {
  for (std::size_t i = 0; i < n; ++i)
    data[i] = std::bit_cast<float>(encode_scalar<Tf32>(data[i], ov) << 13);
}

u32 amax_loop(const float* src, std::size_t n) {
  u32 m = 0;
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, abs_bits(src[i]));
  return m;
}

template <class Out>
using EncodeKernel = void (*)(const float*, Out*, std::size_t, float, Overflow, u32*);
template <class In>
using DecodeKernel = void (*)(const In*, float*, std::size_t, float);
using Fp8DecodeKernel = void (*)(const std::uint8_t*, float*, std::size_t, float, const float*);
using Tf32Kernel = void (*)(float*, std::size_t, Overflow);
using AmaxKernel = u32 (*)(const float*, std::size_t);

#if MIXTRAIN_FORMATS_X86
// ---- x86 kernels. Each is compiled for its own target so the library still loads and runs on a
// CPU without it; dispatch() only installs kernels whose features the CPU reports. -------------
#define MT_AVX2 __attribute__((target("avx2,f16c")))
#define MT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))
#define MT_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,f16c")))

// GCC 12's AVX-512 headers build results from _mm512_undefined_epi32(), which trips a false
// -Wmaybe-uninitialized / -Wuninitialized once inlined (GCC bug 105593).
#pragma GCC diagnostic push
#if !defined(__clang__)  // clang has no -Wmaybe-uninitialized and no such false positive
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace x86 {

MT_AVX2 inline u32 hmax_epu32(__m256i v) {
  alignas(32) u32 lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  return *std::max_element(lanes, lanes + 8);
}

MT_AVX2 inline __m256i abs_bits(__m256 v) {
  return _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7FFFFFFF));
}

// encode_scalar<F>'s magnitude logic on 8 lanes; returns sign | code per 32-bit lane.
template <class F>
MT_AVX2 inline __m256i encode_lanes(__m256i x, bool saturate) {
  constexpr int shift = 23 - F::kM;
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i a = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i sign =
      _mm256_srli_epi32(_mm256_andnot_si256(_mm256_set1_epi32(0x7FFFFFFF), x), 31 - (F::kE + F::kM));
  // Normal in F (for bias 127 also every fp32 subnormal): rebias, then add half-1 plus the kept
  // lsb and truncate, which is round-to-nearest-even.
  const __m256i rebased = _mm256_sub_epi32(a, _mm256_set1_epi32((127 - F::kBias) << 23));
  __m256i r = _mm256_add_epi32(rebased, _mm256_set1_epi32((1 << (shift - 1)) - 1));
  r = _mm256_add_epi32(r, _mm256_and_si256(_mm256_srli_epi32(rebased, shift), one));
  r = _mm256_srli_epi32(r, shift);
  if constexpr (F::kBias != 127) {
    // Subnormal in F: shift the full significand by a per-lane amount. fp32 subnormal inputs get a
    // spurious implicit bit here, harmless: they are < 2^-126 and round to zero either way.
    const __m256i sig = _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0x7FFFFF)),
                                        _mm256_set1_epi32(0x800000));
    __m256i s = _mm256_sub_epi32(_mm256_set1_epi32(shift + 128 - F::kBias), _mm256_srli_epi32(a, 23));
    s = _mm256_min_epi32(s, _mm256_set1_epi32(31));
    const __m256i half_m1 = _mm256_sub_epi32(_mm256_sllv_epi32(one, _mm256_sub_epi32(s, one)), one);
    __m256i sub = _mm256_add_epi32(sig, half_m1);
    sub = _mm256_add_epi32(sub, _mm256_and_si256(_mm256_srlv_epi32(sig, s), one));
    sub = _mm256_srlv_epi32(sub, s);
    const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32((128 - F::kBias) << 23), a);
    r = _mm256_blendv_epi8(r, sub, is_sub);
  }
  const __m256i over = _mm256_cmpgt_epi32(r, _mm256_set1_epi32(static_cast<int>(F::kMax)));
  r = _mm256_blendv_epi8(
      r, _mm256_set1_epi32(static_cast<int>(saturate ? F::kMax : F::kOverflow)), over);
  const __m256i nan = _mm256_or_si256(
      _mm256_set1_epi32(static_cast<int>(F::kOverflow | (1u << (F::kM - 1)))),
      _mm256_srli_epi32(_mm256_and_si256(a, _mm256_set1_epi32(0x7FFFFF)), shift));
  r = _mm256_blendv_epi8(r, nan, _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000)));
  return _mm256_or_si256(r, sign);
}

template <class F>
MT_AVX512 inline __m512i encode_lanes512(__m512i x, bool saturate) {
  constexpr int shift = 23 - F::kM;
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i a = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i sign =
      _mm512_srli_epi32(_mm512_andnot_si512(_mm512_set1_epi32(0x7FFFFFFF), x), 31 - (F::kE + F::kM));
  const __m512i rebased = _mm512_sub_epi32(a, _mm512_set1_epi32((127 - F::kBias) << 23));
  __m512i r = _mm512_add_epi32(rebased, _mm512_set1_epi32((1 << (shift - 1)) - 1));
  r = _mm512_add_epi32(r, _mm512_and_si512(_mm512_srli_epi32(rebased, shift), one));
  r = _mm512_srli_epi32(r, shift);
  if constexpr (F::kBias != 127) {
    const __m512i sig = _mm512_or_si512(_mm512_and_si512(a, _mm512_set1_epi32(0x7FFFFF)),
                                        _mm512_set1_epi32(0x800000));
    __m512i s = _mm512_sub_epi32(_mm512_set1_epi32(shift + 128 - F::kBias), _mm512_srli_epi32(a, 23));
    s = _mm512_min_epi32(s, _mm512_set1_epi32(31));
    const __m512i half_m1 = _mm512_sub_epi32(_mm512_sllv_epi32(one, _mm512_sub_epi32(s, one)), one);
    __m512i sub = _mm512_add_epi32(sig, half_m1);
    sub = _mm512_add_epi32(sub, _mm512_and_si512(_mm512_srlv_epi32(sig, s), one));
    sub = _mm512_srlv_epi32(sub, s);
    const __mmask16 is_sub = _mm512_cmplt_epi32_mask(a, _mm512_set1_epi32((128 - F::kBias) << 23));
    r = _mm512_mask_blend_epi32(is_sub, r, sub);
  }
  const __mmask16 over = _mm512_cmpgt_epi32_mask(r, _mm512_set1_epi32(static_cast<int>(F::kMax)));
  r = _mm512_mask_blend_epi32(
      over, r, _mm512_set1_epi32(static_cast<int>(saturate ? F::kMax : F::kOverflow)));
  const __m512i nan = _mm512_or_si512(
      _mm512_set1_epi32(static_cast<int>(F::kOverflow | (1u << (F::kM - 1)))),
      _mm512_srli_epi32(_mm512_and_si512(a, _mm512_set1_epi32(0x7FFFFF)), shift));
  r = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(0x7F800000)), r, nan);
  return _mm512_or_si512(r, sign);
}

MT_AVX2 inline __m256 load_scaled(const float* p, float scale, __m256i& amax) {
  __m256 v = _mm256_loadu_ps(p);
  amax = _mm256_max_epu32(amax, abs_bits(v));
  return scale == 1.0f ? v : _mm256_mul_ps(v, _mm256_set1_ps(scale));
}

MT_AVX512 inline __m512 load_scaled512(const float* p, float scale, __m512i& amax) {
  __m512 v = _mm512_loadu_ps(p);
  amax = _mm512_max_epu32(amax, _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF)));
  return scale == 1.0f ? v : _mm512_mul_ps(v, _mm512_set1_ps(scale));
}

template <class F, class Out>
void finish(const float* src, Out* dst, std::size_t i, std::size_t n, float scale, Overflow ov,
            u32* amax, u32 vector_max) {
  if (amax != nullptr) *amax = std::max(*amax, vector_max);
  encode_loop<F, Out>(src + i, dst + i, n - i, scale, ov, amax);
}

// fp16 through F16C: vcvtps2ph with an immediate RNE mode (MXCSR's mode is not consulted) already
// is encode_fp16(to_inf_or_nan); saturation turns the inf lanes it produced into ±max.
MT_AVX2 inline __m128i saturate_fp16(__m128i h) {
  const __m128i inf = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7FFF)), _mm_set1_epi16(0x7C00));
  const __m128i max = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(static_cast<short>(0x8000))),
                                   _mm_set1_epi16(0x7BFF));
  return _mm_blendv_epi8(h, max, inf);
}

MT_AVX2 void enc_fp16_f16c(const float* src, std::uint16_t* dst, std::size_t n, float scale,
                           Overflow ov, u32* amax) {
  const bool sat = ov == Overflow::saturate;
  __m256i m = _mm256_setzero_si256();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(load_scaled(src + i, scale, m), _MM_FROUND_TO_NEAREST_INT);
    if (sat) h = saturate_fp16(h);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  finish<Fp16>(src, dst, i, n, scale, ov, amax, hmax_epu32(m));
}

MT_AVX512 void enc_fp16_avx512(const float* src, std::uint16_t* dst, std::size_t n, float scale,
                               Overflow ov, u32* amax) {
  const bool sat = ov == Overflow::saturate;
  __m512i m = _mm512_setzero_si512();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm512_cvtps_ph(load_scaled512(src + i, scale, m), _MM_FROUND_TO_NEAREST_INT);
    if (sat) {
      const __mmask16 inf = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)),
                                                    _mm256_set1_epi16(0x7C00));
      h = _mm256_mask_blend_epi16(
          inf, h,
          _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16(static_cast<short>(0x8000))),
                          _mm256_set1_epi16(0x7BFF)));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
  finish<Fp16>(src, dst, i, n, scale, ov, amax, _mm512_reduce_max_epu32(m));
}

MT_AVX2 void dec_fp16_f16c(const std::uint16_t* src, float* dst, std::size_t n, float scale_inv) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    if (scale_inv != 1.0f) v = _mm256_mul_ps(v, _mm256_set1_ps(scale_inv));
    _mm256_storeu_ps(dst + i, v);
  }
  decode_loop<Fp16>(src + i, dst + i, n - i, scale_inv);
}

// 16 lanes of 32-bit codes < 2^16 -> 16 uint16 in order (packus interleaves 128-bit halves).
MT_AVX2 inline __m256i pack16(__m256i lo, __m256i hi) {
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
}

MT_AVX2 void enc_bf16_avx2(const float* src, std::uint16_t* dst, std::size_t n, float scale,
                           Overflow ov, u32* amax) {
  const bool sat = ov == Overflow::saturate;
  __m256i m = _mm256_setzero_si256();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = encode_lanes<Bf16>(_mm256_castps_si256(load_scaled(src + i, scale, m)), sat);
    const __m256i hi = encode_lanes<Bf16>(_mm256_castps_si256(load_scaled(src + i + 8, scale, m)), sat);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), pack16(lo, hi));
  }
  finish<Bf16>(src, dst, i, n, scale, ov, amax, hmax_epu32(m));
}

MT_AVX512 void enc_bf16_avx512(const float* src, std::uint16_t* dst, std::size_t n, float scale,
                               Overflow ov, u32* amax) {
  const bool sat = ov == Overflow::saturate;
  __m512i m = _mm512_setzero_si512();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i r = encode_lanes512<Bf16>(_mm512_castps_si512(load_scaled512(src + i, scale, m)), sat);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(r));
  }
  finish<Bf16>(src, dst, i, n, scale, ov, amax, _mm512_reduce_max_epu32(m));
}

// vcvtneps2bf16 rounds RNE and quiets NaNs exactly like encode_bf16, but treats fp32 subnormal
// inputs as zero (DAZ regardless of MXCSR); those lanes are redone in integer arithmetic.
MT_AVX512BF16 void enc_bf16_avx512bf16(const float* src, std::uint16_t* dst, std::size_t n,
                                       float scale, Overflow ov, u32* amax) {
  const bool sat = ov == Overflow::saturate;
  __m512i m = _mm512_setzero_si512();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = load_scaled512(src + i, scale, m);
    __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
    const __m512i x = _mm512_castps_si512(v);
    const __mmask16 subnormal = _mm512_test_epi32_mask(x, _mm512_set1_epi32(0x7FFFFF)) &
                                _mm512_testn_epi32_mask(x, _mm512_set1_epi32(0x7F800000));
    if (subnormal != 0)
      h = _mm256_mask_blend_epi16(subnormal, h, _mm512_cvtepi32_epi16(encode_lanes512<Bf16>(x, sat)));
    if (sat) {
      const __mmask16 inf = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)),
                                                    _mm256_set1_epi16(0x7F80));
      h = _mm256_mask_blend_epi16(
          inf, h,
          _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16(static_cast<short>(0x8000))),
                          _mm256_set1_epi16(0x7F7F)));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
  finish<Bf16>(src, dst, i, n, scale, ov, amax, _mm512_reduce_max_epu32(m));
}

MT_AVX2 void dec_bf16_avx2(const std::uint16_t* src, float* dst, std::size_t n, float scale_inv) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i f = _mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(f, _mm256_set1_epi32(0x7FFFFFFF)),
                                           _mm256_set1_epi32(0x7F800000));
    f = _mm256_or_si256(f, _mm256_and_si256(nan, _mm256_set1_epi32(0x00400000)));
    __m256 v = _mm256_castsi256_ps(f);
    if (scale_inv != 1.0f) v = _mm256_mul_ps(v, _mm256_set1_ps(scale_inv));
    _mm256_storeu_ps(dst + i, v);
  }
  decode_loop<Bf16>(src + i, dst + i, n - i, scale_inv);
}

template <class F>
MT_AVX2 void enc_fp8_avx2(const float* src, std::uint8_t* dst, std::size_t n, float scale,
                          Overflow ov, u32* amax) {
  const bool sat = ov == Overflow::saturate;
  __m256i m = _mm256_setzero_si256();
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i r[4];
    for (int k = 0; k < 4; ++k)
      r[k] = encode_lanes<F>(_mm256_castps_si256(load_scaled(src + i + 8 * k, scale, m)), sat);
    // Two packs interleave the 128-bit halves; the permute restores source order.
    const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(r[0], r[1]), _mm256_packus_epi32(r[2], r[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
  finish<F>(src, dst, i, n, scale, ov, amax, hmax_epu32(m));
}

template <class F>
MT_AVX512 void enc_fp8_avx512(const float* src, std::uint8_t* dst, std::size_t n, float scale,
                              Overflow ov, u32* amax) {
  const bool sat = ov == Overflow::saturate;
  __m512i m = _mm512_setzero_si512();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i r = encode_lanes512<F>(_mm512_castps_si512(load_scaled512(src + i, scale, m)), sat);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm512_cvtepi32_epi8(r));
  }
  finish<F>(src, dst, i, n, scale, ov, amax, _mm512_reduce_max_epu32(m));
}

MT_AVX2 void dec_fp8_avx2(const std::uint8_t* src, float* dst, std::size_t n, float scale_inv,
                          const float* table) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i)));
    __m256 v = _mm256_i32gather_ps(table, idx, 4);
    if (scale_inv != 1.0f) v = _mm256_mul_ps(v, _mm256_set1_ps(scale_inv));
    _mm256_storeu_ps(dst + i, v);
  }
  fp8_decode_loop(src + i, dst + i, n - i, scale_inv, table);
}

MT_AVX2 void tf32_avx2(float* data, std::size_t n, Overflow ov) {
  const bool sat = ov == Overflow::saturate;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i* p = reinterpret_cast<__m256i*>(data + i);
    _mm256_storeu_si256(p, _mm256_slli_epi32(encode_lanes<Tf32>(_mm256_loadu_si256(p), sat), 13));
  }
  tf32_loop(data + i, n - i, ov);
}

MT_AVX2 u32 amax_avx2(const float* src, std::size_t n) {
  __m256i m = _mm256_setzero_si256();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_epu32(m, abs_bits(_mm256_loadu_ps(src + i)));
  return std::max(hmax_epu32(m), amax_loop(src + i, n - i));
}

MT_AVX512 u32 amax_avx512(const float* src, std::size_t n) {
  __m512i m = _mm512_setzero_si512();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(src + i)),
                                             _mm512_set1_epi32(0x7FFFFFFF)));
  return std::max(_mm512_reduce_max_epu32(m), amax_loop(src + i, n - i));
}

}  // namespace x86

#pragma GCC diagnostic pop
#endif  // MIXTRAIN_FORMATS_X86

// fp8 decodes go through a table of the scalar results: 256 entries, exact by construction.
struct Fp8Tables {
  float e4m3[256];
  float e5m2[256];
  Fp8Tables() {
    for (unsigned i = 0; i < 256; ++i) {
      e4m3[i] = decode_scalar<E4M3>(i);
      e5m2[i] = decode_scalar<E5M2>(i);
    }
  }
};
const Fp8Tables& fp8_tables() {
  static const Fp8Tables tables;
  return tables;
}

struct Kernels {
  EncodeKernel<std::uint16_t> enc_fp16, enc_bf16;
  EncodeKernel<std::uint8_t> enc_e4m3, enc_e5m2;
  DecodeKernel<std::uint16_t> dec_fp16, dec_bf16;
  Fp8DecodeKernel dec_fp8;
  Tf32Kernel tf32;
  AmaxKernel amax;
  const char* description;
};

const Kernels kScalarKernels{
    encode_loop<Fp16, std::uint16_t>, encode_loop<Bf16, std::uint16_t>,
    encode_loop<E4M3, std::uint8_t>,  encode_loop<E5M2, std::uint8_t>,
    decode_loop<Fp16, std::uint16_t>, decode_loop<Bf16, std::uint16_t>,
    fp8_decode_loop,            tf32_loop,
    amax_loop,
    "scalar: fp16/bf16/fp8/tf32 encode and decode by integer bit manipulation, fp8 decode by table"};

#if MIXTRAIN_FORMATS_X86
Kernels make_avx2() {
  return {x86::enc_fp16_f16c, x86::enc_bf16_avx2, x86::enc_fp8_avx2<E4M3>, x86::enc_fp8_avx2<E5M2>,
          x86::dec_fp16_f16c, x86::dec_bf16_avx2, x86::dec_fp8_avx2,  x86::tf32_avx2,
          x86::amax_avx2,
          "avx2: fp16 encode/decode F16C (vcvtps2ph/vcvtph2ps); bf16, fp8 encode and tf32 AVX2 "
          "integer; bf16 decode AVX2 shift; fp8 decode AVX2 table gather"};
}
Kernels make_avx512(bool bf16_native) {
  Kernels k = make_avx2();  // decodes and tf32 are load/store bound: AVX2 already saturates them
  k.enc_e4m3 = x86::enc_fp8_avx512<E4M3>;
  k.enc_e5m2 = x86::enc_fp8_avx512<E5M2>;
  k.enc_fp16 = x86::enc_fp16_avx512;
  k.amax = x86::amax_avx512;
  if (bf16_native) {
    k.enc_bf16 = x86::enc_bf16_avx512bf16;
    k.description =
        "avx512bf16: fp16 encode AVX-512F vcvtps2ph, decode F16C; bf16 encode AVX512-BF16 "
        "vcvtneps2bf16 (fp32-subnormal lanes redone in integer arithmetic); fp8 encode AVX-512 "
        "integer; bf16 decode, tf32 AVX2; fp8 decode AVX2 table gather";
  } else {
    k.enc_bf16 = x86::enc_bf16_avx512;
    k.description =
        "avx512: fp16 encode AVX-512F vcvtps2ph, decode F16C; bf16 and fp8 encode AVX-512 "
        "integer; bf16 decode, tf32 AVX2; fp8 decode AVX2 table gather";
  }
  return k;
}
#endif

struct Cpu {
  ConversionIsa best = ConversionIsa::scalar;
};

Cpu detect_cpu() noexcept {
  Cpu cpu;
#if MIXTRAIN_FORMATS_X86
  // libgcc's and compiler-rt's checks include the OS's XCR0 state, so "supported" means usable.
  // F16C is read from CPUID leaf 1 (ECX bit 29) because clang 14's __builtin_cpu_supports does
  // not know "f16c"; its OS state (YMM) is the one AVX2 already needs.
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
  if (__builtin_cpu_supports("avx2") && f16c) {
    cpu.best = ConversionIsa::avx2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
      cpu.best = ConversionIsa::avx512;
      if (__builtin_cpu_supports("avx512bf16")) cpu.best = ConversionIsa::avx512bf16;
    }
  }
#endif
  return cpu;
}

struct Dispatch {
  Cpu cpu = detect_cpu();
  Kernels tiers[4] = {kScalarKernels,
#if MIXTRAIN_FORMATS_X86
                      make_avx2(), make_avx512(false), make_avx512(true)
#else
                      kScalarKernels, kScalarKernels, kScalarKernels
#endif
  };
  std::atomic<int> active{static_cast<int>(cpu.best)};
};

Dispatch& dispatch() {
  static Dispatch d;
  return d;
}

const Kernels& kernels() {
  Dispatch& d = dispatch();
  return d.tiers[d.active.load(std::memory_order_relaxed)];
}

void check_sizes(std::size_t src, std::size_t dst, const char* what) {
  if (src != dst)
    throw std::invalid_argument(std::string(what) + ": source has " + std::to_string(src) +
                                " elements but destination has " + std::to_string(dst));
}

[[noreturn]] void bad_dtype(const char* what, DType t) {
  throw std::invalid_argument(std::string(what) + ": dtype " + std::string(dtype_name(t)) +
                              " does not match the element width of this overload");
}

void write_amax(float* out, std::uint32_t bits) {
  if (out != nullptr) *out = std::bit_cast<float>(bits);
}

}  // namespace

std::uint16_t encode_fp16(float x, Overflow overflow) noexcept {
  return static_cast<std::uint16_t>(encode_scalar<Fp16>(x, overflow));
}
float decode_fp16(std::uint16_t bits) noexcept { return decode_scalar<Fp16>(bits); }

std::uint16_t encode_bf16(float x, Overflow overflow) noexcept {
  return static_cast<std::uint16_t>(encode_scalar<Bf16>(x, overflow));
}
float decode_bf16(std::uint16_t bits) noexcept { return decode_scalar<Bf16>(bits); }

std::uint8_t encode_fp8_e4m3(float x, Overflow overflow) noexcept {
  return static_cast<std::uint8_t>(encode_scalar<E4M3>(x, overflow));
}
float decode_fp8_e4m3(std::uint8_t bits) noexcept { return decode_scalar<E4M3>(bits); }

std::uint8_t encode_fp8_e5m2(float x, Overflow overflow) noexcept {
  return static_cast<std::uint8_t>(encode_scalar<E5M2>(x, overflow));
}
float decode_fp8_e5m2(std::uint8_t bits) noexcept { return decode_scalar<E5M2>(bits); }

std::uint8_t encode_fp4_e2m1(float x) noexcept {
  return static_cast<std::uint8_t>(format_rules::encode<E2M1>(x, true));
}
float decode_fp4_e2m1(std::uint8_t bits) noexcept {
  return decode_scalar<E2M1>(bits);
}

std::uint8_t encode_e8m0(float x) noexcept {
  return static_cast<std::uint8_t>(format_rules::encode_e8m0(x));
}
float decode_e8m0(std::uint8_t bits) noexcept {
  return format_rules::decode_e8m0(bits);
}

float round_to_tf32(float x, Overflow overflow) noexcept {
  return std::bit_cast<float>(encode_scalar<Tf32>(x, overflow) << 13);
}

void convert(std::span<const float> src, std::span<std::uint16_t> dst, DType to,
             const EncodeOptions& options) {
  check_sizes(src.size(), dst.size(), "convert fp32->16-bit");
  const Kernels& k = kernels();
  EncodeKernel<std::uint16_t> fn = nullptr;
  if (to == DType::fp16) fn = k.enc_fp16;
  else if (to == DType::bf16) fn = k.enc_bf16;
  else bad_dtype("convert fp32->16-bit", to);
  std::uint32_t m = 0;
  fn(src.data(), dst.data(), src.size(), options.scale, options.overflow,
     options.amax != nullptr ? &m : nullptr);
  write_amax(options.amax, m);
}

void convert(std::span<const float> src, std::span<std::uint8_t> dst, DType to,
             const EncodeOptions& options) {
  check_sizes(src.size(), dst.size(), "convert fp32->fp8");
  const Kernels& k = kernels();
  EncodeKernel<std::uint8_t> fn = nullptr;
  if (to == DType::fp8_e4m3) fn = k.enc_e4m3;
  else if (to == DType::fp8_e5m2) fn = k.enc_e5m2;
  else bad_dtype("convert fp32->fp8", to);
  std::uint32_t m = 0;
  fn(src.data(), dst.data(), src.size(), options.scale, options.overflow,
     options.amax != nullptr ? &m : nullptr);
  write_amax(options.amax, m);
}

void convert(std::span<const std::uint16_t> src, DType from, std::span<float> dst,
             float scale_inv) {
  check_sizes(src.size(), dst.size(), "convert 16-bit->fp32");
  const Kernels& k = kernels();
  if (from == DType::fp16) k.dec_fp16(src.data(), dst.data(), src.size(), scale_inv);
  else if (from == DType::bf16) k.dec_bf16(src.data(), dst.data(), src.size(), scale_inv);
  else bad_dtype("convert 16-bit->fp32", from);
}

void convert(std::span<const std::uint8_t> src, DType from, std::span<float> dst,
             float scale_inv) {
  check_sizes(src.size(), dst.size(), "convert fp8->fp32");
  const Fp8Tables& t = fp8_tables();
  const float* table = nullptr;
  if (from == DType::fp8_e4m3) table = t.e4m3;
  else if (from == DType::fp8_e5m2) table = t.e5m2;
  else bad_dtype("convert fp8->fp32", from);
  kernels().dec_fp8(src.data(), dst.data(), src.size(), scale_inv, table);
}

void round_to_tf32(std::span<float> data, Overflow overflow) noexcept {
  kernels().tf32(data.data(), data.size(), overflow);
}

float abs_max(std::span<const float> data) noexcept {
  return std::bit_cast<float>(kernels().amax(data.data(), data.size()));
}

ConversionIsa supported_conversion_isa() noexcept { return dispatch().cpu.best; }

ConversionIsa limit_conversion_isa(ConversionIsa cap) noexcept {
  Dispatch& d = dispatch();
  const int tier = std::min(static_cast<int>(cap), static_cast<int>(d.cpu.best));
  d.active.store(tier, std::memory_order_relaxed);
  return static_cast<ConversionIsa>(tier);
}

ConversionIsa active_conversion_isa() noexcept {
  return static_cast<ConversionIsa>(dispatch().active.load(std::memory_order_relaxed));
}

const char* conversion_paths() noexcept { return kernels().description; }

}  // namespace mixtrain::sdk
