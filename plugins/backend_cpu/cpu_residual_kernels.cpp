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
void run_pair(const void* dy, const void* y, void* a, void* b, std::int64_t n) {
  const auto* d = static_cast<const TDy*>(dy);
  const auto* m = static_cast<const TY*>(y);
  auto* pa = static_cast<TA*>(a);
  auto* pb = static_cast<TB*>(b);
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (std::int64_t b0 = 0; b0 < n; b0 += kBlock)
    pair_loop_best(d, m, pa, pb, b0, std::min(n, b0 + kBlock));
}

// Resolves the storages one at a time into template arguments.
template <class... Chosen>
void dispatch(const void* dy, const void* y, void* a, void* b, std::int64_t n) {
  run_pair<Chosen...>(dy, y, a, b, n);
}

template <class... Chosen, class... Rest>
void dispatch(const void* dy, const void* y, void* a, void* b, std::int64_t n, ElementStorage next,
              Rest... rest) {
  if (next == ElementStorage::bf16)
    dispatch<Chosen..., Bf16Bits>(dy, y, a, b, n, rest...);
  else
    dispatch<Chosen..., float>(dy, y, a, b, n, rest...);
}

}  // namespace

void residual_backward_pair(const void* dy, ElementStorage dy_storage, const void* y,
                            ElementStorage y_storage, ResidualGradientOut a, ResidualGradientOut b,
                            std::int64_t n) {
  if (n <= 0) return;
  if (y == nullptr) {
    if (dy_storage == ElementStorage::bf16)
      dispatch<Bf16Bits, NoMask>(dy, y, a.data, b.data, n, a.storage, b.storage);
    else
      dispatch<float, NoMask>(dy, y, a.data, b.data, n, a.storage, b.storage);
    return;
  }
  dispatch<>(dy, y, a.data, b.data, n, dy_storage, y_storage, a.storage, b.storage);
}

}  // namespace mixtrain::backend_cpu
