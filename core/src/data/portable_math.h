// Logarithm and exponential that give the same bits on every IEEE-754 machine (internal to the
// core): the data layer's random draws must not depend on the platform's libm, whose last bits
// differ between implementations.
//
// Contract:
// - Built from +, -, *, / and the exact frexp / ldexp only (no fused multiply-add: the sources
//   compile with contraction off), so the result for an input is one value everywhere.
// - portable_log(x) for finite x > 0, portable_exp(x) for finite x with |x| <= 700; both within
//   a few ulp of the true value. Outside the domain the result is unspecified (callers check).
#pragma once

namespace mixtrain::core {

double portable_log(double x);
double portable_exp(double x);

}  // namespace mixtrain::core
