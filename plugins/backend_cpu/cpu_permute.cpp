// The convolution facet's image permutes: channels-first [N, C, H, W] <-> channels-last
// [N, H, W, C], for any pair of storage dtypes (fp32, bf16, fp16).
//
// A per-image transpose of [C, H·W] <-> [H·W, C] in 32x32 tiles (OpenMP over images and tiles),
// moving the stored bits. When the dtypes differ the source is first converted into the
// destination's dtype in scratch (exact decode, one RNE encode through sdk/float_formats.h), so
// each value is rounded once; the transpose then moves bits.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "cpu_access.h"
#include "cpu_permute.h"
#include "cpu_primitive_cache.h"

namespace mixtrain::backend_cpu {

using sdk::DType;
using sdk::TensorView;

namespace {

constexpr std::int64_t kTile = 32;

// dst[i][r][c'] = src[i][c'][r]: `images` matrices of [rows, cols] in src become [cols, rows].
template <class T>
void transpose_images(const T* src, T* dst, std::int64_t images, std::int64_t rows,
                      std::int64_t cols) {
  const std::int64_t row_tiles = (rows + kTile - 1) / kTile;
  const std::int64_t col_tiles = (cols + kTile - 1) / kTile;
  const std::int64_t tiles = images * row_tiles * col_tiles;
#pragma omp parallel for schedule(static) if (parallel_worth(images * rows * cols))
  for (std::int64_t t = 0; t < tiles; ++t) {
    const std::int64_t i = t / (row_tiles * col_tiles);
    const std::int64_t r0 = (t / col_tiles) % row_tiles * kTile;
    const std::int64_t c0 = t % col_tiles * kTile;
    const std::int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
    const T* s = src + i * rows * cols;
    T* d = dst + i * rows * cols;
    for (std::int64_t c = c0; c < c1; ++c)
      for (std::int64_t r = r0; r < r1; ++r) d[c * rows + r] = s[r * cols + c];
  }
}

void permute(std::string_view op, PrimitiveCache& cache, TensorView src, std::int64_t channels,
             std::int64_t height, std::int64_t width, TensorView dst, bool to_last) {
  const std::int64_t images = checks().channel_permute(op, src, channels, height, width, dst);
  const std::int64_t n = src.numel();
  if (n == 0) return;
  const std::int64_t spatial = height * width;
  // Channels-first images are [C, H·W] matrices, channels-last ones [H·W, C].
  const std::int64_t rows = to_last ? channels : spatial;
  const std::int64_t cols = to_last ? spatial : channels;

  const void* from = src.data;
  const bool same =
      src.dtype == dst.dtype || (is_fp32_storage(src.dtype) && is_fp32_storage(dst.dtype));
  if (!same) {
    // Round once into dst's dtype, in scratch, then move bits.
    const TensorView converted{
        cache.scratch<char>(PrimitiveCache::Slot::extra_a,
                            static_cast<std::size_t>(n) * sdk::dtype_size(dst.dtype)),
        dst.dtype, src.shape};
#pragma omp parallel for schedule(static) if (parallel_worth(n))
    for (std::int64_t c0 = 0; c0 < n; c0 += kDecodeChunk)
      copy_elements(src, c0, converted, c0, std::min(kDecodeChunk, n - c0));
    from = converted.data;
  }
  if (sdk::dtype_size(dst.dtype) == 4)
    transpose_images(static_cast<const std::uint32_t*>(from), dst.as<std::uint32_t>(), images, rows,
                     cols);
  else
    transpose_images(static_cast<const std::uint16_t*>(from), dst.as<std::uint16_t>(), images, rows,
                     cols);
}

}  // namespace

void permute_channels(CpuContext& context, std::string_view op, TensorView src,
                      std::int64_t channels, std::int64_t height, std::int64_t width,
                      TensorView dst, bool to_last) {
  context.use_threads();
  permute(op, context.prims(), src, channels, height, width, dst, to_last);
  context.account_scratch();
}

}  // namespace mixtrain::backend_cpu
