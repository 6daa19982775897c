// The element work between flash attention's tile products (cpu_flash_attention.h): the online
// softmax's step, the backward's probabilities and score gradient, and a product tile added into
// its accumulator. Each is compiled for x86-64-v4, v3 and the baseline (cpu_isa.h) and picked by
// cpuid: the exponentials are most of the work, and the build's baseline (SSE2) runs them 4 to a
// register where AVX2 runs 8.
//
// Contract
// - Tiles are dense row-major fp32: s, p, ds [bq, bk] (query rows by key columns), o [bq, d],
//   m, sum [bq] (the running max and sum), lse and delta [bq]. All caller-owned; nothing is
//   allocated. Rows `first`, `first + 1`, ... against keys `j0`, `j0 + 1`, ...: row i sees keys
//   <= i (causal), the rest of its row is exact 0.
// - `pre`: a factor the scores still lack (the bf16 tile products leave the scale out), applied
//   first, one rounding, as sgemm's alpha would; 1 skips it.
// - `rounded` (nullable): the bf16 products' [bq, bk] tile, which receives P (or dS) rounded once
//   to bf16 (cpu_bf16_bits.h) by the kernel that forms it; FP32 products pass none.
// - Sums and maxes of a row run in fixed lanes (cpu_lane_reductions.h): the variants with FMA (v4,
//   v3) give the same bits; the baseline may differ in the last bit of an exponential.
#pragma once

#include <cstdint>

#include "cpu_bf16_bits.h"

namespace mixtrain::backend_cpu {

// The online softmax's step for one score tile: s holds the scores q·kᵀ (times the scale unless
// `pre` still carries it). Each row's running max m and sum are updated, its o accumulator
// rescaled to the new max, and s overwritten with the unnormalised probabilities, ready for
// o += s·v; with `rounded`, they also go there as bf16 (the sum adds them unrounded).
void flash_softmax_step(float* s, std::int64_t bq, std::int64_t bk, std::int64_t first,
                        std::int64_t j0, float pre, float* m, float* sum, float* o, std::int64_t d,
                        Bf16Bits* rounded);

// The backward's probabilities: p = exp(scores − lse) in place over the scores; with `rounded`,
// also rounded into it.
void flash_probabilities(float* p, std::int64_t bq, std::int64_t bk, std::int64_t first,
                         std::int64_t j0, float pre, const float* lse, Bf16Bits* rounded);

// The scores' gradient: ds = p∘(dP − D)·scale in place over dP (ds), D = delta the rows' Σ dO·O;
// with `rounded`, written there rounded to bf16 instead.
void flash_score_gradient(float* ds, const float* p, std::int64_t bq, std::int64_t bk,
                          const float* delta, float scale, Bf16Bits* rounded);

// dst [n] += src [n]: a product tile added into its FP32 accumulator.
void flash_add_into(float* dst, const float* src, std::int64_t n);

}  // namespace mixtrain::backend_cpu
