// The per-ISA element kernels of flash attention (contract in cpu_flash_element_kernels.h).
#include "cpu_flash_element_kernels.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cpu_exp.h"
#include "cpu_isa.h"
#include "cpu_lane_reductions.h"

namespace mixtrain::backend_cpu {

namespace {

// Keys row i sees in the key tile starting at j0 (bk keys). None when the tile starts past i: in
// a decode step the query block is shifted by its start, so its first rows may precede the last
// key tile (queries 50..76 against the tile at 64); a row that sees none keeps its running sums.
[[gnu::always_inline]] inline std::int64_t visible(std::int64_t i, std::int64_t j0,
                                                   std::int64_t bk) {
  return std::max<std::int64_t>(0, std::min(bk, i - j0 + 1));
}

// Lambdas in the per-ISA kernels must be inlined to be compiled for their ISA (cpu_isa.h).
#define MIXTRAIN_FLASH_INLINE __attribute__((always_inline))

[[gnu::always_inline]] inline void softmax_step(float* s, std::int64_t bq, std::int64_t bk,
                                                std::int64_t first, std::int64_t j0, float pre,
                                                float* m, float* sum, float* o, std::int64_t d,
                                                Bf16Bits* rounded) {
  for (std::int64_t r = 0; r < bq; ++r) {
    float* row = s + r * bk;
    Bf16Bits* row16 = rounded != nullptr ? rounded + r * bk : nullptr;
    const std::int64_t seen = visible(first + r, j0, bk);
    // The max and the sum in fixed lanes (cpu_lane_reductions.h): an `omp simd` reduction ended
    // each row in a chain of 16 dependent scalar maxes, then adds.
    const float top =
        pre != 1.0f
            ? lane_max(m[r], seen,
                       [&](std::int64_t j) MIXTRAIN_FLASH_INLINE {
                         const float v = row[j] * pre;
                         row[j] = v;
                         return v;
                       })
            : lane_max(m[r], seen, [&](std::int64_t j) MIXTRAIN_FLASH_INLINE { return row[j]; });
    if (top == -std::numeric_limits<float>::infinity()) {
      // Every score so far is −inf (an infinite key): nothing to add, and m − top would be NaN,
      // which a later finite tile could not undo. The exact softmax gives these keys weight 0.
      if (row16 != nullptr)
        std::fill(row16, row16 + bk, Bf16Bits{0});
      else
        std::fill(row, row + bk, 0.0f);
      continue;
    }
    // Rescale what earlier tiles summed to the new running max (exp(−inf) = 0 at first).
    const float shrink = exp_shifted(m[r] - top);
    const float add =
        lane_sum<float, kReductionLanes>(seen, [&](std::int64_t j) MIXTRAIN_FLASH_INLINE {
          row[j] = exp_shifted(row[j] - top);
          return row[j];
        });
    if (row16 != nullptr) {
      // While the row is in L1 (rounding inside the sum's lanes ran the forward 1.3x slower).
#pragma omp simd
      for (std::int64_t j = 0; j < seen; ++j) row16[j] = bf16_from_float(row[j]);
      for (std::int64_t j = seen; j < bk; ++j) row16[j] = 0;
    } else {
      for (std::int64_t j = seen; j < bk; ++j) row[j] = 0.0f;
    }
    sum[r] = sum[r] * shrink + add;
    m[r] = top;
    if (shrink != 1.0f) {
      float* orow = o + r * d;
#pragma omp simd
      for (std::int64_t c = 0; c < d; ++c) orow[c] *= shrink;
    }
  }
}

[[gnu::always_inline]] inline void probabilities(float* p, std::int64_t bq, std::int64_t bk,
                                                 std::int64_t first, std::int64_t j0, float pre,
                                                 const float* lse, Bf16Bits* rounded) {
  for (std::int64_t r = 0; r < bq; ++r) {
    float* row = p + r * bk;
    const std::int64_t seen = visible(first + r, j0, bk);
    const float shift = lse[r];
    if (pre != 1.0f) {
#pragma omp simd
      for (std::int64_t j = 0; j < seen; ++j) row[j] *= pre;
    }
    if (rounded != nullptr) {
      Bf16Bits* row16 = rounded + r * bk;
#pragma omp simd
      for (std::int64_t j = 0; j < seen; ++j) {
        row[j] = exp_shifted(row[j] - shift);
        row16[j] = bf16_from_float(row[j]);
      }
      for (std::int64_t j = seen; j < bk; ++j) row16[j] = 0;
    } else {
#pragma omp simd
      for (std::int64_t j = 0; j < seen; ++j) row[j] = exp_shifted(row[j] - shift);
    }
    for (std::int64_t j = seen; j < bk; ++j) row[j] = 0.0f;
  }
}

[[gnu::always_inline]] inline void score_gradient(float* ds, const float* p, std::int64_t bq,
                                                  std::int64_t bk, const float* delta, float scale,
                                                  Bf16Bits* rounded) {
  for (std::int64_t r = 0; r < bq; ++r) {
    const float di = delta[r];
    float* dsr = ds + r * bk;
    const float* pr = p + r * bk;
    if (rounded != nullptr) {
      Bf16Bits* row16 = rounded + r * bk;
#pragma omp simd
      for (std::int64_t j = 0; j < bk; ++j)
        row16[j] = bf16_from_float(pr[j] * (dsr[j] - di) * scale);
    } else {
#pragma omp simd
      for (std::int64_t j = 0; j < bk; ++j) dsr[j] = pr[j] * (dsr[j] - di) * scale;
    }
  }
}

[[gnu::always_inline]] inline void add_into(float* dst, const float* src, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

MIXTRAIN_ISA_VARIANTS(softmax_step)
MIXTRAIN_ISA_VARIANTS(probabilities)
MIXTRAIN_ISA_VARIANTS(score_gradient)
MIXTRAIN_ISA_VARIANTS(add_into)

}  // namespace

void flash_softmax_step(float* s, std::int64_t bq, std::int64_t bk, std::int64_t first,
                        std::int64_t j0, float pre, float* m, float* sum, float* o, std::int64_t d,
                        Bf16Bits* rounded) {
  softmax_step_best(s, bq, bk, first, j0, pre, m, sum, o, d, rounded);
}

void flash_probabilities(float* p, std::int64_t bq, std::int64_t bk, std::int64_t first,
                         std::int64_t j0, float pre, const float* lse, Bf16Bits* rounded) {
  probabilities_best(p, bq, bk, first, j0, pre, lse, rounded);
}

void flash_score_gradient(float* ds, const float* p, std::int64_t bq, std::int64_t bk,
                          const float* delta, float scale, Bf16Bits* rounded) {
  score_gradient_best(ds, p, bq, bk, delta, scale, rounded);
}

void flash_add_into(float* dst, const float* src, std::int64_t n) {
  add_into_best(dst, src, n);
}

}  // namespace mixtrain::backend_cpu
