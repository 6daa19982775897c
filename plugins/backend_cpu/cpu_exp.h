// exp_shifted(z): e^z for arguments that a softmax has shifted by its row's max (z <= 0 up to
// rounding), vectorisable under `omp simd`, for the kernels that cpu_isa.h compiles per ISA
// (flash attention, softmax cross-entropy).
//
// Contract
// - Within about 1 ulp of e^z on every float of [-87, 0], measured exhaustively against double
//   exp: at most 0.992 ulp in the baseline build, 1.016 ulp (68 of 1.1e9 inputs above 1) where
//   the compiler contracts the polynomial into FMAs (the AVX2 and AVX-512 variants);
//   exp_shifted(0) is exactly 1. Below -87 (e^z < 2^-126) it is +0, which no row sum can notice;
//   -inf gives +0; NaN stays NaN. Arguments above 0 are clamped at 88 and not meant to be passed.
// - Cephes' expf: z = k·ln2 + r with a two-part ln2, a degree-6 polynomial in r, times 2^k built
//   in the exponent bits (the CUDA backend's softmax uses the same scheme). Branch-free, so
//   `omp simd` vectorises it where glibc's expf is a scalar call per element.
// - always_inline: a caller compiled for an ISA (MIXTRAIN_ISA_VARIANTS) gets it at that width.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace mixtrain::backend_cpu {

#pragma omp declare simd notinbranch
[[gnu::always_inline]] inline float exp_shifted(float z) {
  const float x = z == z ? std::min(std::max(z, -87.0f), 88.0f) : 0.0f;  // NaN: returned below
  // k = round(x / ln2) by the 1.5·2^23 trick (no rounding instruction needed), then r.
  const float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - k * 0.693359375f) - k * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>(static_cast<std::int32_t>(k + 127.0f) << 23);
  const float e = z < -87.0f ? 0.0f : y * scale;
  return z == z ? e : z;
}

}  // namespace mixtrain::backend_cpu
