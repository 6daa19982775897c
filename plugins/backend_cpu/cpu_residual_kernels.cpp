// The residual join's backward as one element-wise loop (contract in the header).
//
// Why a loop of its own: the facet's generic path works in chunks of 2048 elements through
// buffers (dy copied into g, y decoded into a second buffer, the mask, then one bulk conversion
// call per gradient), five passes over each chunk. On ResNet-50's stages that ran at half the
// memory's rate (bench/cnn/bench_bn_add_join, bench/RESULTS.md, session 65); here each element is
// read and written once, decoded and rounded inline.
#include "cpu_residual_kernels.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>

#include "cpu_access.h"  // parallel_worth
#include "cpu_bf16_bits.h"
#include "cpu_isa.h"
#include "cpu_typed_storage.h"

namespace mixtrain::backend_cpu {

namespace {

// A block per OpenMP iteration: a few hundred KiB of traffic, enough to amortise the dispatch.
constexpr std::int64_t kBlock = std::int64_t{1} << 14;

struct NoMask {};

// dy's value as the SDK decodes it: exact, a NaN quieted (sdk/support/float_formats.h), so an fp32
// gradient gets the generic path's bits; a bf16 one is quieted by its rounding anyway.
[[gnu::always_inline]] inline float decode_quiet(const float* p, std::int64_t i) {
  return p[i];
}
[[gnu::always_inline]] inline float decode_quiet(const Bf16Bits* p, std::int64_t i) {
  const std::uint32_t u = static_cast<std::uint32_t>(p[i]) << 16;
  return std::bit_cast<float>((u & 0x7FFFFFFFu) > 0x7F800000u ? u | 0x00400000u : u);
}

// g = dy[i], or +0 where y[i] is not positive (NaN too): a bit mask, so the loop vectorises.
template <class TDy, class TY>
[[gnu::always_inline]] inline float masked(const TDy* dy, const TY* y, std::int64_t i) {
  const float g = decode_quiet(dy, i);
  if constexpr (std::is_same_v<TY, NoMask>) {
    return g;
  } else {
    const std::uint32_t keep = load_as_float(y, i) > 0.0f ? 0xffffffffu : 0u;
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(g) & keep);
  }
}

// a, b may be dy itself (element i is read before it is written) or each other: a simd loop's
// lanes load before they store, so the pragma holds.
template <class TDy, class TY, class TA, class TB>
[[gnu::always_inline]] inline void pair_loop(const TDy* dy, const TY* y, TA* a, TB* b,
                                             std::int64_t begin, std::int64_t end) {
#pragma omp simd
  for (std::int64_t i = begin; i < end; ++i) {
    const float g = masked(dy, y, i);
    store_rounded(a, i, g);
    store_rounded(b, i, g);
  }
}

MIXTRAIN_ISA_VARIANTS(pair_loop)

template <class TDy, class TY, class TA, class TB>
void run_pair(const TDy* dy, const TY* y, TA* a, TB* b, std::int64_t n) {
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (std::int64_t b0 = 0; b0 < n; b0 += kBlock)
    pair_loop_best(dy, y, a, b, b0, std::min(n, b0 + kBlock));
}

}  // namespace

void residual_backward_pair(const sdk::TensorView& dy, const sdk::TensorView& y,
                            const sdk::TensorView& a, const sdk::TensorView& b, std::int64_t n) {
  if (n <= 0) return;
  with_typed(dy, [&](const auto* d) {
    with_typed(a, [&](auto* pa) {
      with_typed(b, [&](auto* pb) {
        if (y.empty())
          run_pair(d, static_cast<const NoMask*>(nullptr), pa, pb, n);
        else
          with_typed(y, [&](const auto* m) { run_pair(d, m, pa, pb, n); });
      });
    });
  });
}

}  // namespace mixtrain::backend_cpu
