// Why a kernel of its own and not a BLAS dgemm: the simulator's contract fixes each output's
// summation order (ascending k in double), which keeps E5M2 blocks, whose sums can round in
// double, identical on every CPU; a BLAS reorders freely. Tiles of 4 rows × 16 columns keep 64
// double accumulators in registers (8 AVX-512 registers) while each k step loads 16 values of b
// and broadcasts 4 of a. The tile is written with vector types: GCC's own vectorisation of the
// scalar loop shuffled lanes more than it multiplied.
#include "cpu_block_gemm_kernel.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "cpu_isa.h"

namespace mixtrain::backend_cpu {

namespace {

constexpr std::int64_t kTileRows = 4;
constexpr std::int64_t kTileCols = 16;
// Blocks of fewer multiply-adds run on the calling thread (as cpu_gemm.cpp's kSingleThreadGemm).
constexpr std::int64_t kParallelMacs = std::int64_t{1} << 21;

struct KBlock {
  const double* a;
  const double* b;
  const float* sa;
  const float* sb;
  float* acc;
  std::int64_t n, kb;
};

// Eight doubles: one AVX-512 register, two AVX2 ones, four SSE2 ones (GCC and clang vector type).
using Vec = double __attribute__((vector_size(64)));
constexpr std::int64_t kLanes = 8;

// Rows i0 … i0+R−1, columns j0 … j0+kTileCols−1: 2·R accumulator vectors, in registers.
template <std::int64_t R>
[[gnu::always_inline]] inline void tile(const KBlock& k, std::int64_t i0, std::int64_t j0) {
  constexpr std::int64_t V = kTileCols / kLanes;
  Vec d[R][V] = {};
  for (std::int64_t t = 0; t < k.kb; ++t) {
    Vec bt[V];
    std::memcpy(bt, k.b + t * k.n + j0, sizeof bt);
    for (std::int64_t r = 0; r < R; ++r) {
      const double ar = k.a[(i0 + r) * k.kb + t];
      for (std::int64_t v = 0; v < V; ++v) d[r][v] += ar * bt[v];
    }
  }
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t c = 0; c < kTileCols; ++c)
      k.acc[(i0 + r) * k.n + j0 + c] +=
          static_cast<float>(d[r][c / kLanes][c % kLanes]) * (k.sa[i0 + r] * k.sb[j0 + c]);
}

// The ragged edge: any rows × cols, one output at a time, in the same order per output.
[[gnu::always_inline]] inline void edge(const KBlock& k, std::int64_t i0, std::int64_t i1,
                                        std::int64_t j0, std::int64_t j1) {
  for (std::int64_t i = i0; i < i1; ++i)
    for (std::int64_t j = j0; j < j1; ++j) {
      double d = 0.0;
      for (std::int64_t t = 0; t < k.kb; ++t) d += k.a[i * k.kb + t] * k.b[t * k.n + j];
      k.acc[i * k.n + j] += static_cast<float>(d) * (k.sa[i] * k.sb[j]);
    }
}

// Rows [i0, i1) of the block; i0 is a multiple of kTileRows.
[[gnu::always_inline]] inline void row_range(const KBlock& k, std::int64_t i0, std::int64_t i1) {
  const std::int64_t full_cols = k.n / kTileCols * kTileCols;
  std::int64_t i = i0;
  for (; i + kTileRows <= i1; i += kTileRows) {
    for (std::int64_t j = 0; j < full_cols; j += kTileCols) tile<kTileRows>(k, i, j);
    edge(k, i, i + kTileRows, full_cols, k.n);
  }
  for (; i < i1; ++i) {
    for (std::int64_t j = 0; j < full_cols; j += kTileCols) tile<1>(k, i, j);
    edge(k, i, i + 1, full_cols, k.n);
  }
}

MIXTRAIN_ISA_VARIANTS(row_range)

}  // namespace

void accumulate_k_block(const double* a, const double* b, const float* sa, const float* sb,
                        float* acc, std::int64_t m, std::int64_t n, std::int64_t kb) {
  const KBlock k{a, b, sa, sb, acc, n, kb};
  const std::int64_t tiles = (m + kTileRows - 1) / kTileRows;
  if (m * n * kb < kParallelMacs || omp_get_max_threads() == 1) {
    row_range_best(k, std::int64_t{0}, m);
    return;
  }
#pragma omp parallel
  {
    const std::int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
    const std::int64_t per = (tiles + team - 1) / team;
    const std::int64_t i0 = std::min(m, t * per * kTileRows);
    const std::int64_t i1 = std::min(m, i0 + per * kTileRows);
    if (i0 < i1) row_range_best(k, i0, i1);
  }
}

}  // namespace mixtrain::backend_cpu
