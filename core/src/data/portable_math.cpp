#include "data/portable_math.h"

#include <cmath>

// Bit-identical results need a*b+c rounded twice everywhere; clang would otherwise fuse it on
// targets with FMA (GCC already does not fuse in ISO mode, -std=c++20).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

namespace mixtrain::core {

// frexp splits off the binary exponent exactly; the mantissa's log comes from the atanh series
// ln(m) = 2·atanh((m − 1) / (m + 1)), which converges fast near m = 1.
double portable_log(double x) {
  int exponent = 0;
  double mantissa = std::frexp(x, &exponent);  // [0.5, 1)
  if (mantissa < 0.70710678118654752440) {
    mantissa *= 2.0;
    exponent -= 1;
  }
  // mantissa in [sqrt(1/2), sqrt(2)): |s| <= 0.1716, s^2 <= 0.0295, 13 terms reach 1e-19.
  const double s = (mantissa - 1.0) / (mantissa + 1.0);
  const double s2 = s * s;
  double series = 0.0;
  for (int k = 12; k >= 0; --k) series = series * s2 + 1.0 / static_cast<double>(2 * k + 1);
  constexpr double kLn2 = 0.69314718055994530942;
  return static_cast<double>(exponent) * kLn2 + 2.0 * s * series;
}

// exp(x) = 2^n · exp(r) with n = nearest integer to x / ln 2 and |r| <= ln2 / 2; ln 2 is split
// into a high part with trailing zero bits (n · kLn2High is exact for |n| < 2^11) and a low part,
// so r keeps its precision. 2^n is applied by ldexp, which is exact.
double portable_exp(double x) {
  constexpr double kLn2High = 0x1.62e42fee00000p-1;
  constexpr double kLn2Low = 0x1.a39ef35793c76p-33;
  constexpr double kInvLn2 = 1.44269504088896340736;
  const double scaled = x * kInvLn2;
  // Round half away from zero by truncation of ±0.5: the choice of n only moves r within range.
  const int n = static_cast<int>(scaled < 0.0 ? scaled - 0.5 : scaled + 0.5);
  const double r = (x - static_cast<double>(n) * kLn2High) - static_cast<double>(n) * kLn2Low;
  // |r| <= 0.3466: the Taylor series to r^17/17! is below 1e-20 relative.
  double series = 1.0;
  for (int k = 17; k >= 1; --k) series = 1.0 + r * series / static_cast<double>(k);
  return std::ldexp(series, n);
}

}  // namespace mixtrain::core
