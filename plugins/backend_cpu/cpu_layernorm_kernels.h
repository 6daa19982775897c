// The row kernels of the CPU backend's layer norm over [rows, n] tensors (x, y, a, b, sum, dy,
// dx): the forward's statistics, normalisation and the residual add before it, in one pass per
// row, and the backward's rows.
//
// Contract
// - T (x, a, b, sum) and Y (y) are float (fp32 storage) or Bf16Bits (bf16 storage, decoded and
//   rounded inline: cpu_bf16_bits.h). gamma and beta are fp32 [n] (the caller passes ones and
//   zeros for absent ones); mean and rstd fp32 [rows]. All caller-owned.
// - Row r: the mean and the (two-pass) variance are summed in double in a fixed order (32
//   interleaved partial sums added pairwise in a tree: cpu_lane_reductions.h), so every ISA
//   variant, thread count and storage type gives the same bits for the same values; mean =
//   (float)(Σx / n), rstd = (float)(1 / sqrt(Σ(x − mean)² / n + eps)) in double; y = (x −
//   mean)·rstd·gamma + beta in fp32, each operation rounded (no contraction), stored once into Y.
// - layernorm_rows: y may be x when Y is T (each element is read before it is written).
// - add_layernorm_rows: sum = a + b in fp32, rounded once into T, then the layer norm of the sum as
//   stored; sum may be a or b.
// - normalize_float_row: one row already in fp32, with the same arithmetic: the facet's path for
//   other storage (fp16, mixed dtypes) runs it, so every path writes the same bits. out may be in.
// - OpenMP over contiguous row ranges with the calling thread's team; small tensors run on the
//   calling thread (parallel_worth). Each kernel is compiled for x86-64-v4, x86-64-v3 and the
//   baseline (cpu_isa.h); cpuid picks one.
#pragma once

#include <cstdint>

#include "cpu_bf16_bits.h"

namespace mixtrain::backend_cpu {

template <class T, class Y>
void layernorm_rows(const T* x, Y* y, std::int64_t rows, std::int64_t n, float eps,
                    const float* gamma, const float* beta, float* mean, float* rstd);

template <class T, class Y>
void add_layernorm_rows(const T* a, const T* b, T* sum, Y* y, std::int64_t rows, std::int64_t n,
                        float eps, const float* gamma, const float* beta, float* mean, float* rstd);

void normalize_float_row(const float* in, std::int64_t n, float eps, const float* gamma,
                         const float* beta, float* out, float* mean, float* rstd);

// Rows [r0, r1) of the backward, on the calling thread, for (T, D) = (float, float) or
// (Bf16Bits, Bf16Bits); the facet runs other storage (fp16, mixed, bf16 with an fp32 dx) as
// (float, float) one decoded row at a time (r0 = 0, r1 = 1, the row's mean and rstd), so every
// path writes the same bits. With xhat = (x − mean)·rstd, g = dy·gamma (fp32):
//   dx = rstd·(g − mean(g) − xhat·mean(g·xhat)), the means summed in double in the forward's
//   fixed order; stored into dx, or added to it (`add_into_dx`: D is float, the running sum);
//   dx may be dy (same storage).
//   dgamma_part[j] += dy·xhat and dbeta_part[j] += dy, in double over the rows (either may be
//   null): the caller sums its threads' parts in a fixed order.
template <class T, class D>
void layernorm_backward_range(const T* x, const T* dy, const float* gamma, const float* mean,
                              const float* rstd, D* dx, bool add_into_dx, std::int64_t r0,
                              std::int64_t r1, std::int64_t n, double* dgamma_part,
                              double* dbeta_part);

}  // namespace mixtrain::backend_cpu
