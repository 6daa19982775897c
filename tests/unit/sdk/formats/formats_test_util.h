// Independent definitions of the narrow formats for the tests: values written out from the
// format parameters with ldexp, and a round-to-nearest-even reference that searches the sorted
// table of representable values. Nothing here shares code with sdk/src/float_formats.cpp.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/sdk/support/float_formats.h"

namespace formats_test {

namespace sdk = mixtrain::sdk;

struct Spec {
  const char* name;
  int e_bits, m_bits, bias;
  bool has_inf;         // IEEE-like all-ones exponent; otherwise only S.1..1.1..1 is NaN (E4M3)
  std::uint32_t max;    // largest finite magnitude code
};

inline constexpr Spec kFp16{"fp16", 5, 10, 15, true, 0x7BFF};
inline constexpr Spec kBf16{"bf16", 8, 7, 127, true, 0x7F7F};
inline constexpr Spec kTf32{"tf32", 8, 10, 127, true, 0x3FBFF};  // codes = fp32 bits >> 13
inline constexpr Spec kE4M3{"e4m3", 4, 3, 7, false, 0x7E};
inline constexpr Spec kE5M2{"e5m2", 5, 2, 15, true, 0x7B};

inline std::uint32_t sign_bit(const Spec& s) { return 1u << (s.e_bits + s.m_bits); }

enum class Kind { finite, inf, nan };

inline Kind kind_of(const Spec& s, std::uint32_t code) {
  const std::uint32_t e_all = (1u << s.e_bits) - 1, m_all = (1u << s.m_bits) - 1;
  const std::uint32_t e = (code >> s.m_bits) & e_all, m = code & m_all;
  if (s.has_inf && e == e_all) return m == 0 ? Kind::inf : Kind::nan;
  if (!s.has_inf && e == e_all && m == m_all) return Kind::nan;
  return Kind::finite;
}

// (-1)^s * 2^(e-bias) * (1 + m/2^M), or (-1)^s * 2^(1-bias) * (m/2^M) for subnormals.
inline double value_of(const Spec& s, std::uint32_t code) {
  const std::uint32_t e_all = (1u << s.e_bits) - 1, m_all = (1u << s.m_bits) - 1;
  const std::uint32_t e = (code >> s.m_bits) & e_all, m = code & m_all;
  const double sign = (code & sign_bit(s)) != 0 ? -1.0 : 1.0;
  switch (kind_of(s, code)) {
    case Kind::inf: return sign * std::numeric_limits<double>::infinity();
    case Kind::nan: return std::numeric_limits<double>::quiet_NaN();
    case Kind::finite: break;
  }
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), 1 - s.bias - s.m_bits);
  return sign * std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -s.m_bits), static_cast<int>(e) - s.bias);
}

// Positive finite values indexed by code: code order is value order for these formats.
inline const std::vector<double>& positive_values(const Spec& s) {
  static std::vector<double> tables[5];
  const Spec* all[] = {&kFp16, &kBf16, &kTf32, &kE4M3, &kE5M2};
  for (int i = 0; i < 5; ++i) {
    if (std::string_view(all[i]->name) != s.name) continue;
    if (tables[i].empty())
      for (std::uint32_t c = 0; c <= s.max; ++c) tables[i].push_back(value_of(s, c));
    return tables[i];
  }
  std::abort();
}

// What encode must return for a non-NaN x: nearest value, ties to the even code; a value that
// rounds beyond max (where code max+1 would be, with unbounded exponent) overflows.
inline std::uint32_t reference_encode(const Spec& s, float x, sdk::Overflow ov) {
  const std::vector<double>& v = positive_values(s);
  const std::uint32_t sign = std::signbit(x) ? sign_bit(s) : 0;
  const std::uint32_t overflow_code =
      ov == sdk::Overflow::saturate ? s.max : (s.has_inf ? ((1u << s.e_bits) - 1) << s.m_bits
                                                         : sign_bit(s) - 1);
  const double ax = std::fabs(static_cast<double>(x));
  const double beyond = v[s.max] + (v[s.max] - v[s.max - 1]);
  if (std::isinf(ax) || ax >= beyond) return sign | overflow_code;
  const std::size_t i =
      static_cast<std::size_t>(std::upper_bound(v.begin(), v.end(), ax) - v.begin()) - 1;
  if (v[i] == ax) return sign | static_cast<std::uint32_t>(i);
  const double hi = i + 1 <= s.max ? v[i + 1] : beyond;
  const double dlo = ax - v[i], dhi = hi - ax;
  std::uint32_t code = static_cast<std::uint32_t>(i);
  if (dhi < dlo || (dhi == dlo && (i & 1) != 0)) code = static_cast<std::uint32_t>(i + 1);
  if (code > s.max) return sign | overflow_code;
  return sign | code;
}

// Calls the SDK's scalar encoder for spec s (tf32 codes are fp32 bits >> 13).
inline std::uint32_t sdk_encode(const Spec& s, float x, sdk::Overflow ov) {
  const std::string n = s.name;
  if (n == "fp16") return sdk::encode_fp16(x, ov);
  if (n == "bf16") return sdk::encode_bf16(x, ov);
  if (n == "e4m3") return sdk::encode_fp8_e4m3(x, ov);
  if (n == "e5m2") return sdk::encode_fp8_e5m2(x, ov);
  return std::bit_cast<std::uint32_t>(sdk::round_to_tf32(x, ov)) >> 13;
}

inline float sdk_decode(const Spec& s, std::uint32_t code) {
  const std::string n = s.name;
  if (n == "fp16") return sdk::decode_fp16(static_cast<std::uint16_t>(code));
  if (n == "bf16") return sdk::decode_bf16(static_cast<std::uint16_t>(code));
  if (n == "e4m3") return sdk::decode_fp8_e4m3(static_cast<std::uint8_t>(code));
  if (n == "e5m2") return sdk::decode_fp8_e5m2(static_cast<std::uint8_t>(code));
  return std::bit_cast<float>(code << 13);
}

inline bool is_nan_code(const Spec& s, std::uint32_t code) { return kind_of(s, code) == Kind::nan; }

inline float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }
inline std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }

// Inputs that stress every format: raw random bit patterns (NaNs with payloads, infs, fp32
// subnormals), log-uniform magnitudes over each format's subnormal, normal and overflow ranges,
// and exact midpoints between neighbouring codes of every format (± one fp32 ulp).
inline std::vector<float> stress_sample(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> out;
  out.reserve(n);
  std::uniform_int_distribution<std::uint32_t> any;
  const Spec* specs[] = {&kFp16, &kBf16, &kTf32, &kE4M3, &kE5M2};
  // Binary-exponent ranges: fp32 subnormals, bf16 boundary, fp16 subnormals, e4m3/e5m2
  // subnormals, unit range, fp8 / fp16 overflow, fp32 max.
  const int ranges[][2] = {{-149, -126}, {-130, -120}, {-26, -13}, {-12, -5}, {-18, -13},
                           {-3, 3},      {6, 10},      {13, 18},   {120, 128}};
  while (out.size() < n) {
    const std::uint32_t r = any(rng);
    const float sign = (r & 1) != 0 ? -1.0f : 1.0f;
    switch (r % 4) {
      case 0:
        out.push_back(from_bits(any(rng)));
        break;
      case 1: {
        const auto& rg = ranges[(r >> 2) % std::size(ranges)];
        std::uniform_real_distribution<double> e(rg[0], rg[1]);
        out.push_back(sign * static_cast<float>(std::exp2(e(rng))));
        break;
      }
      default: {
        const Spec& s = *specs[(r >> 2) % 5];
        const std::uint32_t code = any(rng) % s.max;  // midpoint of (code, code + 1)
        const float mid = static_cast<float>((value_of(s, code) + value_of(s, code + 1)) / 2);
        const int nudge = static_cast<int>((r >> 8) % 3) - 1;  // -1, 0, +1 ulp
        float x = mid;
        if (nudge < 0) x = std::nextafter(mid, 0.0f);
        if (nudge > 0) x = std::nextafter(mid, std::numeric_limits<float>::infinity());
        out.push_back(sign * x);
        break;
      }
    }
  }
  return out;
}

// OCP MX v1.0's FP4 (E2M1) values, by magnitude code.
inline const std::vector<double>& e2m1_values() {
  static const std::vector<double> v = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return v;
}

// The nearest code to a finite magnitude a (exact, in double) on a grid of positive values by
// code, ties to the even code; from the overflow threshold (half a step above the last value) on,
// `overflow`.
inline std::uint32_t nearest_code(const std::vector<double>& values, double a,
                                  std::uint32_t overflow) {
  const std::size_t top = values.size() - 1;
  const double beyond = values[top] + (values[top] - values[top - 1]);
  if (a >= beyond) return overflow;
  std::size_t i = 0;
  while (i < top && values[i + 1] <= a) ++i;
  if (values[i] == a) return static_cast<std::uint32_t>(i);
  const double hi = i < top ? values[i + 1] : beyond;
  const double dlo = a - values[i], dhi = hi - a;
  const std::size_t code = (dhi < dlo || (dhi == dlo && i % 2 == 1)) ? i + 1 : i;
  return code > top ? overflow : static_cast<std::uint32_t>(code);
}

// The MX block-scale exponents by their definitions: floor(log2 amax) - emax_elem, and the least
// k with amax <= max·2^k; both clamped to [-127, 127], amax 0 -> -127.
inline int mx_floor_definition(double amax, int emax_elem) {
  if (amax == 0) return -127;
  return std::clamp(std::ilogb(amax) - emax_elem, -127, 127);
}
inline int mx_round_up_definition(double amax, double max) {
  if (amax == 0) return -127;
  int k = std::ilogb(amax) - std::ilogb(max) - 1;
  while (amax > std::ldexp(max, k)) ++k;
  return std::clamp(k, -127, 127);
}

}  // namespace formats_test
