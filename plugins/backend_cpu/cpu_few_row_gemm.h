// Few-row GEMM: C = A · Bᵀ (+ bias) for a handful of rows of A, over bf16 operands with B stored
// [n, k] (a linear layer's weight as the layer keeps it): decoding's token-at-a-time products,
// which read every weight once a token and so are worth what the memory delivers. oneDNN 2.6's
// brgemm ran GPT-2 small's at 9-17 GB/s of the 25 that this VM's two cores read
// (bench/RESULTS.md, session 75).
//
// Contract
// - a: [m, k] bf16, row-major; b: [n, k] bf16, row-major; bias: fp32 [n] or null; c: [m, n] fp32
//   or bf16 (c_bf16), row-major. 1 <= m <= kFewGemmRows, n >= 1, k >= 1; c overlaps none of the
//   others. a_fp32 is scratch of 2 * m * k floats (A's rows decoded, and split as the AVX-512
//   kernel reads them).
// - Each C value is the FP32 sum of its k exact products (a product of two bf16 values is exact in
//   fp32, barring underflow) in 32 lanes: product p joins lane p mod 32, each lane adding its
//   products in order; the lanes are then added in a fixed order (lane 2l to lane 2l + 1, then
//   those 16 pairwise), and the bias last; a bf16 C is that rounded once (RNE, NaNs quieted:
//   cpu_bf16_bits.h). The lanes are what one 512-bit load of 32 bf16 values gives, split into its
//   even and odd elements by a shift and a mask. No flush to zero: the emulated bf16 route's
//   definition (cpu_gemm.h), summed in another order. Each value is summed by one thread, one
//   IEEE operation a step (no FMA contraction), so the bits are the same on any thread count and
//   at every ISA variant.
// - Parallel over blocks of B's rows on the OpenMP team when the product is large enough
//   (parallel_worth); compiled for x86-64-v4, x86-64-v3 and the baseline (cpu_isa.h).
#pragma once

#include <cstdint>

#include "cpu_bf16_bits.h"

namespace mixtrain::backend_cpu {

// One row is decoding's case; at two the kernel still matched oneDNN's brgemm, at four it trailed
// it (fewer weights' bytes per arithmetic operation: bench/RESULTS.md, session 75).
inline constexpr std::int64_t kFewGemmRows = 2;

void few_row_gemm_bf16(const Bf16Bits* a, const Bf16Bits* b, const float* bias, std::int64_t m,
                       std::int64_t n, std::int64_t k, void* c, bool c_bf16, float* a_fp32);

}  // namespace mixtrain::backend_cpu
