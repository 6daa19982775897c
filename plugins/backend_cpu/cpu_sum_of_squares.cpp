#include "cpu_sum_of_squares.h"

#include <numeric>
#include <string>
#include <vector>

#include "cpu_access.h"
#include "cpu_isa.h"
#include "cpu_pieces.h"
#include "cpu_prefetch.h"

namespace mixtrain::backend_cpu {

using sdk::TensorView;

namespace {

#define MIXTRAIN_SUM_INLINE __attribute__((always_inline))

// Σ x² in kLanes double lanes, each summing every kLanes-th element of the chunk in order, the
// lanes then added pairwise in a fixed tree. Why lanes: one vector accumulator made the sum a
// chain of dependent adds, which ran the gradient check at under half the memory's rate; and
// since a float's square is exact in double (48 significant bits), the lanes give the same bits
// on every ISA and with or without FMA, where the simd reduction's order followed the vector
// width. The finite check and the unscale (x *= scale, written back when `out` is given) share
// the loop, so a chunk is read once.
constexpr int kLanes = 32;
// A block of lanes is prefetch_ahead's block (cpu_prefetch.h): one request per block covers it.
static_assert(kLanes == kStreamBlock);

template <bool kScale, bool kSum>
[[gnu::always_inline]] inline void lanes_kernel(const float* x, float* out, std::int64_t len,
                                                float scale, ChunkCheck* r) {
  alignas(64) double acc[kLanes] = {};
  alignas(64) int bad[kLanes] = {};
  auto lane = [&](std::int64_t i, int j) MIXTRAIN_SUM_INLINE {
    float v = x[i];
    if constexpr (kScale) {
      v *= scale;
      out[i] = v;
    }
    bad[j] |= nonfinite_flag(v);
    if constexpr (kSum) acc[j] += static_cast<double>(v) * static_cast<double>(v);
  };
  std::int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    prefetch_ahead(x, i);  // the gradients come from memory after the backward (cpu_prefetch.h)
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) lane(i + j, j);
  }
  for (int j = 0; i + j < len; ++j) lane(i + j, j);
  int any = 0;
  for (int j = 0; j < kLanes; ++j) any |= bad[j];
  r->nonfinite = any;
  if constexpr (kSum) {
    for (int w = kLanes / 2; w > 0; w /= 2)
      for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
    r->sum_of_squares = acc[0];
  }
}

// The four passes the callers make, each compiled per ISA (cpu_isa.h).
[[gnu::always_inline]] inline void check(const float* x, std::int64_t len, ChunkCheck* r) {
  lanes_kernel<false, false>(x, nullptr, len, 1.0f, r);
}
[[gnu::always_inline]] inline void check_sum(const float* x, std::int64_t len, ChunkCheck* r) {
  lanes_kernel<false, true>(x, nullptr, len, 1.0f, r);
}
[[gnu::always_inline]] inline void scale_check(float* x, std::int64_t len, float scale,
                                               ChunkCheck* r) {
  lanes_kernel<true, false>(x, x, len, scale, r);
}
[[gnu::always_inline]] inline void scale_check_sum(float* x, std::int64_t len, float scale,
                                                   ChunkCheck* r) {
  lanes_kernel<true, true>(x, x, len, scale, r);
}
MIXTRAIN_ISA_VARIANTS(check)
MIXTRAIN_ISA_VARIANTS(check_sum)
MIXTRAIN_ISA_VARIANTS(scale_check)
MIXTRAIN_ISA_VARIANTS(scale_check_sum)

}  // namespace

double chunk_sum_of_squares(const float* x, std::int64_t len) {
  ChunkCheck r;
  check_sum_best(x, len, &r);
  return r.sum_of_squares;
}

ChunkCheck chunk_scale_and_check(float* x, std::int64_t len, float scale, bool sum_squares) {
  ChunkCheck r;
  if (scale == 1.0f) {
    if (sum_squares)
      check_sum_best(static_cast<const float*>(x), len, &r);
    else
      check_best(static_cast<const float*>(x), len, &r);
  } else if (sum_squares) {
    scale_check_sum_best(x, len, scale, &r);
  } else {
    scale_check_best(x, len, scale, &r);
  }
  return r;
}

double sum_of_squares(const CpuContext& context, std::span<const TensorView> tensors) {
  context.use_threads();
  for (std::size_t i = 0; i < tensors.size(); ++i)
    require_storage("sum_of_squares", "tensors[" + std::to_string(i) + "]", tensors[i]);
  const auto pieces = split(tensors.size(), [&](std::size_t t) { return tensors[t].numel(); });
  const std::int64_t count = static_cast<std::int64_t>(pieces.size());
  std::vector<double> piece_sum(pieces.size());
#pragma omp parallel for schedule(static) if (parallel_worth(total_len(pieces)))
  for (std::int64_t k = 0; k < count; ++k) {
    const Piece& pc = pieces[static_cast<std::size_t>(k)];
    double local = 0.0;
    for (std::int64_t c0 = 0; c0 < pc.len; c0 += kChunk) {
      const std::int64_t len = std::min(kChunk, pc.len - c0);
      float buf[kChunk];
      local += chunk_sum_of_squares(read_chunk(tensors[pc.tensor], pc.begin + c0, len, buf), len);
    }
    piece_sum[static_cast<std::size_t>(k)] = local;
  }
  return std::accumulate(piece_sum.begin(), piece_sum.end(), 0.0);
}

}  // namespace mixtrain::backend_cpu
