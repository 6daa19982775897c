// Per-channel batch-norm kernels over channels-last [rows, C] (contract in the header).
//
// Why not oneDNN's batch norm: on ResNet-20's shapes (batch 128; 16 ch at 32×32, 32 at 16×16, 64
// at 8×8) oneDNN 2.6's nhwc bnorm_jit took 0.42 / 0.19 / 0.09 ms forward and 0.61 / 0.30 / 0.15 ms
// backward with 2 threads on an AVX-512 Zen 4, fp32 and bf16 alike (bench/RESULTS.md); these
// loops do the same work in about half that (one read of x for the statistics, one read and one
// write for the output; the backward two reads of x and dy and one write), and they need no ReLU
// mask in memory.
//
// Layout of the work: each thread owns a contiguous range of rows. The statistics walk it in
// blocks of about kChunk elements and at least 16 rows (whole rows, cache-resident for the second
// look); within a block, channel slices of at most kSlice channels keep their accumulators in
// registers. Up to 64 channels the other loops work the same way; wider tensors are walked a row
// at a time across all its slices, the gradient sums going straight into the thread's
// per-channel doubles. C = 16, 32, 64 (and any multiple of 64) run slices whose width is a
// compile-time constant. bf16 is converted in the loops themselves (a shift in, RNE out): a
// separate conversion pass per block cost as much as the arithmetic. fp16 runs the fp32 loops on
// chunks of rows decoded with F16C (Fp16Chunks, below).
#include "cpu_batchnorm_kernels.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <span>
#include <type_traits>
#include <vector>

#include "cpu_access.h"  // kChunk, parallel_worth
#include "cpu_isa.h"
#include "cpu_prefetch.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::backend_cpu {

namespace {

constexpr std::int64_t kSlice = 64;

// The loops must be inlined into the per-ISA entry points to be compiled for their ISA (a lambda
// left out of line is compiled for the baseline, and its std::fma becomes a libm call).
#define MIXTRAIN_INLINE __attribute__((always_inline))

// Rows per block: whole rows, about kChunk elements, and at least kMinBlockRows. With one or two
// rows a block (ResNet-50's 1024 and 2048 channels), each 64-channel slice set up and merged its
// accumulators for one or two rows' worth of work: the statistics ran 4-8x slower per element
// than at 64 channels. 16 rows of 2048 fp32 channels, 128 KiB, stay in L2 for the second look.
constexpr std::int64_t kMinBlockRows = 16;
std::int64_t block_rows(std::int64_t channels) {
  return std::max<std::int64_t>(kMinBlockRows, kChunk / channels);
}

// Channel counts past one slice walk each row across all its slices before the next row (the
// backward's and the forward's element-wise loops, the gradient sums into the thread's own
// per-channel doubles): slice by slice over a block of rows strided by C, the loops revisited
// the block's rows once per slice and ran 2-3x slower per element at 2048 channels than at 64.
inline bool wide(std::int64_t channels) {
  return channels > kSlice;
}

// Calls body(slice_begin, slice_width, first_element) for every row of [r0, r1) of a wide tensor,
// each row's slices in turn: full 64-channel slices, whose width is a compile-time constant once
// body is inlined, then the remainder.
// Each slice first asks for its elements kPrefetchBytes on in the tensors it reads (the passes
// stream them from memory: with the hardware prefetcher alone the sums' pass read 17 GB/s and the
// statistics' 11-13 on an AMX Xeon whose two cores read 28; bench/RESULTS.md, session 70).
template <class Body, class T, class... More>
[[gnu::always_inline]] inline void for_wide_rows(std::int64_t r0, std::int64_t r1,
                                                 std::int64_t channels, Body&& body, const T* first,
                                                 const More*... more) {
  auto slice = [&](std::int64_t c0, std::int64_t w, std::int64_t base) MIXTRAIN_INLINE {
    prefetch_span(base + kPrefetchElements<T>, w, first, more...);
    body(c0, w, base);
  };
  for (std::int64_t i = r0; i < r1; ++i) {
    std::int64_t c0 = 0;
    for (; c0 + kSlice <= channels; c0 += kSlice) slice(c0, kSlice, i * channels + c0);
    if (c0 < channels) slice(c0, channels - c0, i * channels + c0);
  }
}

// Calls body(width, slice_begin, slice_width) with width a compile-time constant where it can be.
template <class Body>
[[gnu::always_inline]] inline void for_slices(std::int64_t channels, Body&& body) {
  switch (channels) {
    case 16:
      body(std::integral_constant<int, 16>{}, 0, 16);
      return;
    case 32:
      body(std::integral_constant<int, 32>{}, 0, 32);
      return;
    default:
      break;
  }
  std::int64_t c0 = 0;
  for (; c0 + kSlice <= channels; c0 += kSlice) body(std::integral_constant<int, 64>{}, c0, kSlice);
  if (c0 < channels) body(std::integral_constant<int, 0>{}, c0, channels - c0);
}

// Running (count, mean, m2) per channel of one thread, merged block by block.
struct Moments {
  double count = 0;
  std::vector<double> mean, m2;
  explicit Moments(std::int64_t channels)
      : mean(static_cast<std::size_t>(channels)), m2(static_cast<std::size_t>(channels)) {}
};

// Merges a block of nb rows, (mean_b, q_b) per channel, into the channels' running (count, mean,
// m2) (Chan et al.). The weights depend on the counts alone, so they are divided out once for all
// the channels: with a division per channel, the merge of 16-row blocks took most of the wide
// statistics' time (two scalar divisions for every 16 elements).
struct MergeWeights {
  double of_delta, of_square;
  MergeWeights(double count, double nb)
      : of_delta(nb / (count + nb)), of_square(count * nb / (count + nb)) {}
  [[gnu::always_inline]] void merge(double& mean, double& m2, double mean_b, double q_b) const {
    const double delta = mean_b - mean;
    mean += delta * of_delta;
    m2 += q_b + delta * delta * of_square;
  }
};

// Independent accumulators per slice: a 16- or 32-channel slice is one or two vectors per row,
// and one running sum across rows would wait on the adder's latency every row.
template <int kW>
constexpr int kLanes = kW == 16   ? 4
                       : kW == 32 ? 2
                                  : 1;

// x: a block of nr rows of stride `channels`; this slice is channels [c0, c0 + w).
template <int kW, class T>
[[gnu::always_inline]] inline void block_moments(const T* x, std::int64_t nr, std::int64_t channels,
                                                 std::int64_t c0, std::int64_t w_rt, Moments& m) {
  constexpr int kU = kLanes<kW>;
  const std::int64_t w = kW > 0 ? kW : w_rt;
  alignas(64) float s[kU][kSlice] = {};
  std::int64_t r = 0;
  for (; r + kU <= nr; r += kU)
    for (int u = 0; u < kU; ++u) {
      const std::int64_t base = (r + u) * channels + c0;
      prefetch_span(base + nr * channels, w, x);  // this slice of the next block's row
#pragma omp simd
      for (std::int64_t c = 0; c < w; ++c) s[u][c] += load_as_float(x, base + c);
    }
  for (; r < nr; ++r) {
    const std::int64_t base = r * channels + c0;
#pragma omp simd
    for (std::int64_t c = 0; c < w; ++c) s[0][c] += load_as_float(x, base + c);
  }
  alignas(64) float mb[kSlice];
  const float inv = 1.0f / static_cast<float>(nr);
  for (std::int64_t c = 0; c < w; ++c) {
    float total = 0.0f;
    for (int u = 0; u < kU; ++u) total += s[u][c];
    mb[c] = total * inv;
  }
  alignas(64) float q[kU][kSlice] = {};
  for (r = 0; r + kU <= nr; r += kU)
    for (int u = 0; u < kU; ++u) {
      const std::int64_t base = (r + u) * channels + c0;
#pragma omp simd
      for (std::int64_t c = 0; c < w; ++c) {
        const float d = load_as_float(x, base + c) - mb[c];
        q[u][c] = std::fma(d, d, q[u][c]);
      }
    }
  for (; r < nr; ++r) {
    const std::int64_t base = r * channels + c0;
#pragma omp simd
    for (std::int64_t c = 0; c < w; ++c) {
      const float d = load_as_float(x, base + c) - mb[c];
      q[0][c] = std::fma(d, d, q[0][c]);
    }
  }
  const MergeWeights mw(m.count, static_cast<double>(nr));
  double* mean = m.mean.data() + c0;
  double* m2 = m.m2.data() + c0;
#pragma omp simd
  for (std::int64_t c = 0; c < w; ++c) {
    double qc = 0.0;
    for (int u = 0; u < kU; ++u) qc += static_cast<double>(q[u][c]);
    mw.merge(mean[c], m2[c], static_cast<double>(mb[c]), qc);
  }
}

template <class T>
[[gnu::always_inline]] inline void range_moments(const T* x, std::int64_t r0, std::int64_t r1,
                                                 std::int64_t channels, Moments* moments) {
  Moments& m = *moments;
  const std::int64_t step = block_rows(channels);
  for (std::int64_t r = r0; r < r1; r += step) {
    const std::int64_t nr = std::min(step, r1 - r);
    const T* xb = x + r * channels;
    for_slices(channels, [&](auto width, std::int64_t c0, std::int64_t w) MIXTRAIN_INLINE {
      block_moments<decltype(width)::value>(xb, nr, channels, c0, w, m);
    });
    m.count += static_cast<double>(nr);
  }
}

// (x − mean)·scale + shift, the one expression the forward and the ReLU mask's recomputation use.
[[gnu::always_inline]] inline float affine(float x, float mean, float scale, float shift) {
  return std::fma(x - mean, scale, shift);
}

// y = act(affine(x) + residual), residual nullptr: none; the sum in FP32, rounded once.
template <class T>
[[gnu::always_inline]] inline void range_affine(const T* x, const T* residual, T* y,
                                                std::int64_t r0, std::int64_t r1,
                                                std::int64_t channels, const float* mean,
                                                const float* scale, const float* shift, bool relu) {
  if (wide(channels)) {
    for_wide_rows(
        r0, r1, channels,
        [&](std::int64_t c0, std::int64_t w, std::int64_t base) MIXTRAIN_INLINE {
          const float *m = mean + c0, *s = scale + c0, *t = shift + c0;
#pragma omp simd
          for (std::int64_t c = 0; c < w; ++c) {
            float v = affine(load_as_float(x, base + c), m[c], s[c], t[c]);
            if (residual != nullptr) v += load_as_float(residual, base + c);
            store_rounded(y, base + c, relu && v < 0.0f ? 0.0f : v);  // NaN stays
          }
        },
        x, residual);
    return;
  }
  const std::int64_t step = block_rows(channels);
  for (std::int64_t r = r0; r < r1; r += step) {
    const std::int64_t nr = std::min(step, r1 - r);
    for_slices(channels, [&](auto width, std::int64_t c0, std::int64_t w_rt) MIXTRAIN_INLINE {
      constexpr int kW = decltype(width)::value;
      const std::int64_t w = kW > 0 ? kW : w_rt;
      alignas(64) float m[kSlice], s[kSlice], t[kSlice];
      for (std::int64_t c = 0; c < w; ++c) {
        m[c] = mean[c0 + c];
        s[c] = scale[c0 + c];
        t[c] = shift[c0 + c];
      }
      for (std::int64_t i = r; i < r + nr; ++i) {
        const std::int64_t base = i * channels + c0;
        prefetch_span(base + kPrefetchElements<T>, w, x, residual);
        if (residual != nullptr && relu) {
#pragma omp simd
          for (std::int64_t c = 0; c < w; ++c) {
            const float v = affine(load_as_float(x, base + c), m[c], s[c], t[c]) +
                            load_as_float(residual, base + c);
            store_rounded(y, base + c, v < 0.0f ? 0.0f : v);  // NaN stays
          }
        } else if (residual != nullptr) {
#pragma omp simd
          for (std::int64_t c = 0; c < w; ++c)
            store_rounded(y, base + c,
                          affine(load_as_float(x, base + c), m[c], s[c], t[c]) +
                              load_as_float(residual, base + c));
        } else if (relu) {
#pragma omp simd
          for (std::int64_t c = 0; c < w; ++c) {
            const float v = affine(load_as_float(x, base + c), m[c], s[c], t[c]);
            store_rounded(y, base + c, v < 0.0f ? 0.0f : v);  // NaN stays
          }
        } else {
#pragma omp simd
          for (std::int64_t c = 0; c < w; ++c)
            store_rounded(y, base + c, affine(load_as_float(x, base + c), m[c], s[c], t[c]));
        }
      }
    });
  }
}

// g = dy where the ReLU let the forward's value through, else 0. dy is loaded whatever the mask
// says and then selected: a load under the condition vectorises only where the ISA has masked
// loads of the element's width, and AVX2 has none for 16 bits (bf16 ran scalar, 4-8x slower).
template <ReluMask::Kind kMask, class T>
[[gnu::always_inline]] inline float masked(const T* x, const T* dy, const T* y, std::int64_t i,
                                           float mean, float scale, float shift) {
  const float g = load_as_float(dy, i);
  if constexpr (kMask == ReluMask::Kind::recompute)
    return affine(load_as_float(x, i), mean, scale, shift) > 0.0f ? g : 0.0f;
  else if constexpr (kMask == ReluMask::Kind::from_y)
    return load_as_float(y, i) > 0.0f ? g : 0.0f;
  else
    return g;
}

// The per-slice constants of the backward: mean, and the mask's scale and shift.
template <ReluMask::Kind kMask>
[[gnu::always_inline]] inline void mask_constants(const ReluMask& mask, const float* mean,
                                                  std::int64_t c0, std::int64_t w, float* m,
                                                  float* s, float* t) {
  for (std::int64_t c = 0; c < w; ++c) {
    m[c] = mean[c0 + c];
    s[c] = kMask == ReluMask::Kind::recompute ? mask.scale[c0 + c] : 0.0f;
    t[c] = kMask == ReluMask::Kind::recompute ? mask.shift[c0 + c] : 0.0f;
  }
}

template <ReluMask::Kind kMask, class T>
[[gnu::always_inline]] inline void range_grad_sums(std::integral_constant<ReluMask::Kind, kMask>,
                                                   const T* x, const T* dy,
                                                   const ReluMask* mask_ptr, std::int64_t r0,
                                                   std::int64_t r1, std::int64_t channels,
                                                   const float* mean, double* sum_g,
                                                   double* sum_gx) {
  const ReluMask& mask = *mask_ptr;
  const T* y = static_cast<const T*>(mask.y);
  if (wide(channels)) {
    // Straight into the thread's sums (zero on entry): C doubles twice, L1- or L2-resident, and a
    // row's slices are independent chains.
    const float* s = kMask == ReluMask::Kind::recompute ? mask.scale : mean;
    const float* t = kMask == ReluMask::Kind::recompute ? mask.shift : mean;
    for_wide_rows(
        r0, r1, channels,
        [&](std::int64_t c0, std::int64_t w, std::int64_t base) MIXTRAIN_INLINE {
          const float *m = mean + c0, *sc = s + c0, *sh = t + c0;
          double *a1 = sum_g + c0, *a2 = sum_gx + c0;
#pragma omp simd
          for (std::int64_t c = 0; c < w; ++c) {
            const double g = masked<kMask>(x, dy, y, base + c, m[c], sc[c], sh[c]);
            a1[c] += g;
            a2[c] = std::fma(g, static_cast<double>(load_as_float(x, base + c)) - m[c], a2[c]);
          }
        },
        x, dy, y);
    return;
  }
  const std::int64_t step = block_rows(channels);
  for (std::int64_t r = r0; r < r1; r += step) {
    const std::int64_t nr = std::min(step, r1 - r);
    for_slices(channels, [&](auto width, std::int64_t c0, std::int64_t w_rt) MIXTRAIN_INLINE {
      constexpr int kW = decltype(width)::value;
      const std::int64_t w = kW > 0 ? kW : w_rt;
      constexpr int kU = kLanes<kW>;
      alignas(64) float m[kSlice], s[kSlice], t[kSlice];
      alignas(64) double a1[kU][kSlice] = {}, a2[kU][kSlice] = {};
      mask_constants<kMask>(mask, mean, c0, w, m, s, t);
      auto row = [&](std::int64_t i, int u) MIXTRAIN_INLINE {
        const std::int64_t base = i * channels + c0;
        prefetch_span(base + kPrefetchElements<T>, w, x, dy, y);
#pragma omp simd
        for (std::int64_t c = 0; c < w; ++c) {
          const double g = masked<kMask>(x, dy, y, base + c, m[c], s[c], t[c]);
          a1[u][c] += g;
          a2[u][c] = std::fma(g, static_cast<double>(load_as_float(x, base + c)) - m[c], a2[u][c]);
        }
      };
      std::int64_t i = r;
      for (; i + kU <= r + nr; i += kU)
        for (int u = 0; u < kU; ++u) row(i + u, u);
      for (; i < r + nr; ++i) row(i, 0);
      for (std::int64_t c = 0; c < w; ++c)
        for (int u = 0; u < kU; ++u) {
          sum_g[c0 + c] += a1[u][c];
          sum_gx[c0 + c] += a2[u][c];
        }
    });
  }
}

template <ReluMask::Kind kMask, class T>
[[gnu::always_inline]] inline void range_grad_input(
    std::integral_constant<ReluMask::Kind, kMask>, const T* x, const T* dy,
    const ReluMask* mask_ptr, T* dx, std::int64_t r0, std::int64_t r1, std::int64_t channels,
    const float* mean, const float* ka, const float* kb, const float* kd) {
  const ReluMask& mask = *mask_ptr;
  const T* y = static_cast<const T*>(mask.y);
  if (wide(channels)) {
    const float* s = kMask == ReluMask::Kind::recompute ? mask.scale : mean;
    const float* t = kMask == ReluMask::Kind::recompute ? mask.shift : mean;
    for_wide_rows(
        r0, r1, channels,
        [&](std::int64_t c0, std::int64_t w, std::int64_t base) MIXTRAIN_INLINE {
          const float *m = mean + c0, *sc = s + c0, *sh = t + c0, *a = ka + c0, *b = kb + c0,
                      *d = kd + c0;
#pragma omp simd
          for (std::int64_t c = 0; c < w; ++c) {
            const float g = masked<kMask>(x, dy, y, base + c, m[c], sc[c], sh[c]);
            store_rounded(
                dx, base + c,
                std::fma(a[c], g, std::fma(b[c], load_as_float(x, base + c) - m[c], d[c])));
          }
        },
        x, dy, y);
    return;
  }
  const std::int64_t step = block_rows(channels);
  for (std::int64_t r = r0; r < r1; r += step) {
    const std::int64_t nr = std::min(step, r1 - r);
    for_slices(channels, [&](auto width, std::int64_t c0, std::int64_t w_rt) MIXTRAIN_INLINE {
      constexpr int kW = decltype(width)::value;
      const std::int64_t w = kW > 0 ? kW : w_rt;
      alignas(64) float m[kSlice], s[kSlice], t[kSlice], a[kSlice], b[kSlice], d[kSlice];
      mask_constants<kMask>(mask, mean, c0, w, m, s, t);
      for (std::int64_t c = 0; c < w; ++c) {
        a[c] = ka[c0 + c];
        b[c] = kb[c0 + c];
        d[c] = kd[c0 + c];
      }
      for (std::int64_t i = r; i < r + nr; ++i) {
        const std::int64_t base = i * channels + c0;
        prefetch_span(base + kPrefetchElements<T>, w, x, dy, y);
#pragma omp simd
        for (std::int64_t c = 0; c < w; ++c) {
          const float g = masked<kMask>(x, dy, y, base + c, m[c], s[c], t[c]);
          store_rounded(dx, base + c,
                        std::fma(a[c], g, std::fma(b[c], load_as_float(x, base + c) - m[c], d[c])));
        }
      }
    });
  }
}

// Each range kernel is compiled for x86-64-v4, x86-64-v3 and the baseline (cpu_isa.h).
MIXTRAIN_ISA_VARIANTS(range_moments)
MIXTRAIN_ISA_VARIANTS(range_affine)
MIXTRAIN_ISA_VARIANTS(range_grad_sums)
MIXTRAIN_ISA_VARIANTS(range_grad_input)

// Calls body(thread, first_row, end_row) on each thread's contiguous share of the rows, or once
// on the calling thread when the tensor is small.
template <class Body>
void for_row_ranges(std::int64_t rows, std::int64_t channels, Body&& body) {
  if (!parallel_worth(rows * channels)) {
    body(0, std::int64_t{0}, rows);
    return;
  }
#pragma omp parallel
  {
    const std::int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
    const std::int64_t per = (rows + team - 1) / team;
    const std::int64_t r0 = std::min(rows, t * per);
    body(static_cast<int>(t), r0, std::min(rows, r0 + per));
  }
}

int max_team() {
  return std::max(1, omp_get_max_threads());
}

// fp16 storage. bf16 is decoded and rounded in the kernels' loops (a shift); fp16 is not: an
// in-loop integer decode and encode (what F16C does, written in integer operations, since GCC 12
// and clang 14 generate no F16C conversions from scalar code) vectorised but ran the kernels 3-9x
// slower than bf16. Instead each thread walks its rows in chunks of whole blocks (the fp32
// kernels' blocks, block_rows), decodes a chunk's inputs into its own fp32 buffers with the SDK's
// bulk conversion (F16C where the CPU has it), runs the fp32 range kernel on the chunk and
// encodes its output once. The blocks and their order are the fp32 kernel's, so the results are
// the fp32 kernel's on the decoded values, each output rounded once, bit for bit; the scratch is
// four chunks a thread, not fp32 copies of whole tensors. A chunk is about 16K elements, or one
// block where a block is larger (16 rows: 128 KiB at 2048 channels).
constexpr std::int64_t kFp16ChunkElements = 16384;

class Fp16Chunks {
 public:
  explicit Fp16Chunks(std::int64_t channels)
      : channels_(channels),
        rows_(block_rows(channels) *
              std::max<std::int64_t>(1, kFp16ChunkElements / (block_rows(channels) * channels))) {}

  // Calls body(first_row, row_count) for each chunk of [r0, r1), in order.
  template <class Body>
  void for_each(std::int64_t r0, std::int64_t r1, Body&& body) const {
    for (std::int64_t r = r0; r < r1; r += rows_) body(r, std::min(rows_, r1 - r));
  }

  // Rows [r, r + nr) of src decoded into buffer `slot` (0-2); nullptr for a null src.
  const float* decode(int slot, const Fp16Bits* src, std::int64_t r, std::int64_t nr) {
    if (src == nullptr) return nullptr;
    const auto n = static_cast<std::size_t>(nr * channels_);
    std::vector<float>& b = buffer(slot, n);
    sdk::convert(std::span(reinterpret_cast<const std::uint16_t*>(src + r * channels_), n),
                 sdk::DType::fp16, std::span(b.data(), n));
    return b.data();
  }
  // The output buffer for nr rows.
  float* output(std::int64_t nr) {
    return buffer(3, static_cast<std::size_t>(nr * channels_)).data();
  }
  // The output buffer's nr rows, rounded once, into rows [r, r + nr) of dst.
  void encode(Fp16Bits* dst, std::int64_t r, std::int64_t nr) {
    const auto n = static_cast<std::size_t>(nr * channels_);
    sdk::convert(std::span<const float>(buffers_[3].data(), n),
                 std::span(reinterpret_cast<std::uint16_t*>(dst + r * channels_), n),
                 sdk::DType::fp16);
  }

 private:
  std::vector<float>& buffer(int slot, std::size_t n) {
    std::vector<float>& b = buffers_[static_cast<std::size_t>(slot)];
    if (b.size() < n) b.resize(n);
    return b;
  }

  std::int64_t channels_, rows_;
  std::array<std::vector<float>, 4> buffers_;
};

template <class T>
inline constexpr bool kChunkedFp16 = std::is_same_v<T, Fp16Bits>;

#undef MIXTRAIN_INLINE

}  // namespace

template <class T>
void channel_moments(const T* x, std::int64_t rows, std::int64_t channels, float* mean,
                     float* var) {
  std::vector<Moments> parts(static_cast<std::size_t>(max_team()), Moments(channels));
  for_row_ranges(rows, channels, [&](int t, std::int64_t r0, std::int64_t r1) {
    Moments* part = &parts[static_cast<std::size_t>(t)];
    if constexpr (kChunkedFp16<T>) {
      Fp16Chunks chunks(channels);
      chunks.for_each(r0, r1, [&](std::int64_t r, std::int64_t nr) {
        range_moments_best(chunks.decode(0, x, r, nr), std::int64_t{0}, nr, channels, part);
      });
    } else {
      range_moments_best(x, r0, r1, channels, part);
    }
  });
  Moments all(channels);
  for (const Moments& p : parts) {
    if (p.count == 0) continue;
    const MergeWeights mw(all.count, p.count);
    for (std::size_t c = 0; c < all.mean.size(); ++c)
      mw.merge(all.mean[c], all.m2[c], p.mean[c], p.m2[c]);
    all.count += p.count;
  }
  for (std::size_t c = 0; c < all.mean.size(); ++c) {
    mean[c] = static_cast<float>(all.mean[c]);
    var[c] = static_cast<float>(all.m2[c] / all.count);
  }
}

template <class T>
void channel_affine(const T* x, T* y, std::int64_t rows, std::int64_t channels, const float* mean,
                    const float* scale, const float* shift, bool relu) {
  channel_affine_add(x, static_cast<const T*>(nullptr), y, rows, channels, mean, scale, shift,
                     relu);
}

template <class T>
void channel_affine_add(const T* x, const T* residual, T* y, std::int64_t rows,
                        std::int64_t channels, const float* mean, const float* scale,
                        const float* shift, bool relu) {
  for_row_ranges(rows, channels, [&](int, std::int64_t r0, std::int64_t r1) {
    if constexpr (kChunkedFp16<T>) {
      // The chunk's x and residual are read before its y is written: y may be either.
      Fp16Chunks chunks(channels);
      chunks.for_each(r0, r1, [&](std::int64_t r, std::int64_t nr) {
        const float* xs = chunks.decode(0, x, r, nr);
        const float* rs = chunks.decode(1, residual, r, nr);
        range_affine_best(xs, rs, chunks.output(nr), std::int64_t{0}, nr, channels, mean, scale,
                          shift, relu);
        chunks.encode(y, r, nr);
      });
    } else {
      range_affine_best(x, residual, y, r0, r1, channels, mean, scale, shift, relu);
    }
  });
}

template <class T>
void channel_grad_sums(const T* x, const T* dy, const ReluMask& mask, std::int64_t rows,
                       std::int64_t channels, const float* mean, double* sum_g, double* sum_gx) {
  using K = ReluMask::Kind;
  const auto team = static_cast<std::size_t>(max_team());
  const auto c = static_cast<std::size_t>(channels);
  // Each thread's sums, added across threads in thread order after the rows (the same bits on
  // every run for a given team). A thread sums into a vector of its own while it runs and copies
  // it into its slice at the end, as layer norm's backward does: summing in the slices, the wide
  // path (every channel's two sums updated each row) ran no faster on 2 threads than on 1 at 256
  // and 512 channels (bench/RESULTS.md, session 66).
  std::vector<double> parts(2 * team * c, 0.0);
  // The sums of rows [r0, r1) of x, dy and the mask's y (stored, or a decoded chunk) added into g.
  auto sums = [&](auto* xs, auto* dys, const ReluMask& m, std::int64_t r0, std::int64_t r1,
                  double* g) {
    if (m.kind == K::recompute)
      range_grad_sums_best(std::integral_constant<K, K::recompute>{}, xs, dys, &m, r0, r1, channels,
                           mean, g, g + c);
    else if (m.kind == K::from_y)
      range_grad_sums_best(std::integral_constant<K, K::from_y>{}, xs, dys, &m, r0, r1, channels,
                           mean, g, g + c);
    else
      range_grad_sums_best(std::integral_constant<K, K::none>{}, xs, dys, &m, r0, r1, channels,
                           mean, g, g + c);
  };
  for_row_ranges(rows, channels, [&](int t, std::int64_t r0, std::int64_t r1) {
    std::vector<double> mine(2 * c, 0.0);
    double* g = mine.data();
    if constexpr (kChunkedFp16<T>) {
      Fp16Chunks chunks(channels);
      chunks.for_each(r0, r1, [&](std::int64_t r, std::int64_t nr) {
        ReluMask m = mask;
        m.y = chunks.decode(2, static_cast<const Fp16Bits*>(mask.y), r, nr);
        sums(chunks.decode(0, x, r, nr), chunks.decode(1, dy, r, nr), m, std::int64_t{0}, nr, g);
      });
    } else {
      sums(x, dy, mask, r0, r1, g);
    }
    std::copy(mine.begin(), mine.end(), parts.begin() + 2 * static_cast<std::ptrdiff_t>(t) * c);
  });
  for (std::size_t j = 0; j < c; ++j) {
    sum_g[j] = 0.0;
    sum_gx[j] = 0.0;
    for (std::size_t t = 0; t < team; ++t) {
      sum_g[j] += parts[2 * t * c + j];
      sum_gx[j] += parts[2 * t * c + c + j];
    }
  }
}

template <class T>
void channel_grad_input(const T* x, const T* dy, const ReluMask& mask, T* dx, std::int64_t rows,
                        std::int64_t channels, const float* mean, const float* a, const float* b,
                        const float* d) {
  using K = ReluMask::Kind;
  // dx of rows [r0, r1) from x, dy and the mask's y.
  auto input = [&](auto* xs, auto* dys, const ReluMask& m, auto* dxs, std::int64_t r0,
                   std::int64_t r1) {
    if (m.kind == K::recompute)
      range_grad_input_best(std::integral_constant<K, K::recompute>{}, xs, dys, &m, dxs, r0, r1,
                            channels, mean, a, b, d);
    else if (m.kind == K::from_y)
      range_grad_input_best(std::integral_constant<K, K::from_y>{}, xs, dys, &m, dxs, r0, r1,
                            channels, mean, a, b, d);
    else
      range_grad_input_best(std::integral_constant<K, K::none>{}, xs, dys, &m, dxs, r0, r1,
                            channels, mean, a, b, d);
  };
  for_row_ranges(rows, channels, [&](int, std::int64_t r0, std::int64_t r1) {
    if constexpr (kChunkedFp16<T>) {
      // The chunk's inputs are read before its dx is written: dx may be dy.
      Fp16Chunks chunks(channels);
      chunks.for_each(r0, r1, [&](std::int64_t r, std::int64_t nr) {
        ReluMask m = mask;
        m.y = chunks.decode(2, static_cast<const Fp16Bits*>(mask.y), r, nr);
        input(chunks.decode(0, x, r, nr), chunks.decode(1, dy, r, nr), m, chunks.output(nr),
              std::int64_t{0}, nr);
        chunks.encode(dx, r, nr);
      });
    } else {
      input(x, dy, mask, dx, r0, r1);
    }
  });
}

#define MIXTRAIN_BATCHNORM_KERNELS(T)                                                         \
  template void channel_moments<T>(const T*, std::int64_t, std::int64_t, float*, float*);     \
  template void channel_affine<T>(const T*, T*, std::int64_t, std::int64_t, const float*,     \
                                  const float*, const float*, bool);                          \
  template void channel_affine_add<T>(const T*, const T*, T*, std::int64_t, std::int64_t,     \
                                      const float*, const float*, const float*, bool);        \
  template void channel_grad_sums<T>(const T*, const T*, const ReluMask&, std::int64_t,       \
                                     std::int64_t, const float*, double*, double*);           \
  template void channel_grad_input<T>(const T*, const T*, const ReluMask&, T*, std::int64_t,  \
                                      std::int64_t, const float*, const float*, const float*, \
                                      const float*);
MIXTRAIN_BATCHNORM_KERNELS(float)
MIXTRAIN_BATCHNORM_KERNELS(Bf16Bits)
MIXTRAIN_BATCHNORM_KERNELS(Fp16Bits)
#undef MIXTRAIN_BATCHNORM_KERNELS

}  // namespace mixtrain::backend_cpu
