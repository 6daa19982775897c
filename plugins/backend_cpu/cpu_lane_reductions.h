// Fixed-lane reductions for the kernels compiled per ISA (cpu_isa.h): the sum or the max of n
// values, value(0) .. value(n - 1), each asked for once and in order.
//
// Contract
// - kReductionLanes float lanes: lane l takes the values l, l + kReductionLanes, ... in order, and
//   the lanes are then combined pairwise in a fixed tree. A sum therefore has the same bits at
//   every vector width (8 or 16 floats) and every ISA variant, given the same values.
// - lane_max(init, n, value): the largest of init and the non-NaN values (a value that is NaN never
//   wins, the select `v > top ? v : top` of a scan); init when n is 0.
// - lane_sum(n, value): the fp32 sum in the order above; 0 when n is 0.
// - value is called exactly once per index, in increasing order, so it may also store what it
//   computes (an exponential into the row it reads).
// - Why not `omp simd reduction`: GCC compiles it into an array of the vector's lanes that a
//   scalar loop adds after the vectorised one, 16 dependent adds (or maxes) a call at AVX-512's
//   width: on flash attention's 128-key rows that chain cost more than the row's exponentials
//   (bench/RESULTS.md, session 66). The fixed tree's depth is 4.
// - Header-only and always inlined, so it compiles for the ISA variant that calls it.
#pragma once

#include <cstdint>

namespace mixtrain::backend_cpu {

inline constexpr int kReductionLanes = 16;

template <class Value>
[[gnu::always_inline]] inline float lane_sum(std::int64_t n, Value&& value) {
  alignas(64) float acc[kReductionLanes] = {};
  std::int64_t i = 0;
  for (; i + kReductionLanes <= n; i += kReductionLanes) {
#pragma omp simd
    for (int l = 0; l < kReductionLanes; ++l) acc[l] += value(i + l);
  }
  for (int l = 0; i + l < n; ++l) acc[l] += value(i + l);
  for (int w = kReductionLanes / 2; w > 0; w /= 2) {
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
