// Fixed-lane reductions for the kernels compiled per ISA (cpu_isa.h): the sum or the max of n
// values, value(0) .. value(n - 1), each asked for once and in order.
//
// Contract
// - lane_sum<Acc, kLanes>(n, value): kLanes accumulators of type Acc (float or double); lane l
//   adds the values l, l + kLanes, ... in order (the tail's values join their lanes too), and the
//   lanes are then added pairwise in a fixed tree. A sum therefore has the same bits at every
//   vector width and every ISA variant, given the same values; 0 when n is 0. Flash attention's
//   rows sum 16 floats (one AVX-512 register), the loss's row and layer norm's rows 32 doubles.
// - lane_max(init, n, value): kReductionLanes float lanes; the largest of init and the non-NaN
//   values (a value that is NaN never wins, the select `v > top ? v : top` of a scan); init when
//   n is 0.
// - value is called exactly once per index, in increasing order, so it may also store what it
//   computes (an exponential into the row it reads).
// - Why not `omp simd reduction`: GCC compiles it into an array of the vector's lanes that a
//   scalar loop adds after the vectorised one, 16 dependent adds (or maxes) a call at AVX-512's
//   width: on flash attention's 128-key rows that chain cost more than the row's exponentials
//   (bench/RESULTS.md, session 66). And fewer lanes than the vector holds (layer norm had 8
//   doubles, one AVX-512 register) make every add wait on the one before it.
// - Header-only and always inlined, so it compiles for the ISA variant that calls it.
#pragma once

#include <cstdint>

namespace mixtrain::backend_cpu {

inline constexpr int kReductionLanes = 16;

template <class Acc, int kLanes, class Value>
[[gnu::always_inline]] inline Acc lane_sum(std::int64_t n, Value&& value) {
  static_assert(kLanes > 0 && (kLanes & (kLanes - 1)) == 0, "a power of two, for the tree");
  alignas(64) Acc acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) acc[l] += value(i + l);
  }
  for (int l = 0; i + l < n; ++l) acc[l] += value(i + l);
  for (int w = kLanes / 2; w > 0; w /= 2) {
#pragma omp simd
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  }
  return acc[0];
}

template <class Value>
[[gnu::always_inline]] inline float lane_max(float init, std::int64_t n, Value&& value) {
  alignas(64) float acc[kReductionLanes];
  for (float& a : acc) a = init;
  std::int64_t i = 0;
  for (; i + kReductionLanes <= n; i += kReductionLanes) {
#pragma omp simd
    for (int l = 0; l < kReductionLanes; ++l) {
      const float v = value(i + l);
      acc[l] = v > acc[l] ? v : acc[l];
    }
  }
  for (int l = 0; i + l < n; ++l) {
    const float v = value(i + l);
    acc[l] = v > acc[l] ? v : acc[l];
  }
  for (int w = kReductionLanes / 2; w > 0; w /= 2) {
#pragma omp simd
    for (int l = 0; l < w; ++l) acc[l] = acc[l + w] > acc[l] ? acc[l + w] : acc[l];
  }
  return acc[0];
}

}  // namespace mixtrain::backend_cpu
