// The block-scaled GEMM simulator's inner loop: one k-block's exact dot products, scaled and
// added to the fp32 accumulator.
//
// Contract
// - accumulate_k_block: for every i < m and j < n,
//     dot = Σ a[i·kb + t] · b[t·n + j] over t = 0 … kb−1, ascending, in double;
//     acc[i·n + j] += float(dot) · (sa[i] · sb[j]), each step one fp32 operation.
//   a is [m, kb] (op(A)'s k-block, decoded element values), b is [kb, n] (op(B)'s), sa is [m] and
//   sb is [n] (their block scales); acc is [m, n] fp32, read and written. No view may overlap acc.
// - Each (i, j) sees the same operations in the same order whatever the tiling, the ISA variant
//   and the thread count, so the result is bit-identical across CPUs and team sizes. Each product
//   of two element values (E4M3, E5M2 or E2M1: at most 4 significant bits each) is exact in double.
// - Runs on the OpenMP team when the block holds enough multiply-adds to pay for it.
#pragma once

#include <cstdint>

namespace mixtrain::backend_cpu {

void accumulate_k_block(const double* a, const double* b, const float* sa, const float* sb,
                        float* acc, std::int64_t m, std::int64_t n, std::int64_t kb);

}  // namespace mixtrain::backend_cpu
