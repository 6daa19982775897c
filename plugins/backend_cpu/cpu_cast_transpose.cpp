// The FP8 cast-transpose on the CPU: each 64 x 64 tile of src is decoded to fp32 and encoded once
// by the SDK's bulk encoder, then its rows are copied into out and its columns into
// out_transposed. Why tiles: the transposed write touches 64 rows of out_transposed per tile, 64
// bytes each, instead of one byte in each of `rows` rows per source row.
#include "cpu_cast_transpose.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_access.h"
#include "cpu_activation_kernels.h"

namespace mixtrain::backend_cpu {

namespace {
constexpr std::int64_t kTile = 64;
}  // namespace

void cast_transpose(CpuContext& context, const sdk::CastTransposeArgs& args) {
  context.use_threads();
  // Plain variables: OpenMP regions may not capture structured bindings (clang).
  const auto shape = checks().cast_transpose_shape(args);
  const std::int64_t rows = shape.rows, cols = shape.cols;
  const sdk::DType to = args.out.empty() ? args.out_transposed.dtype : args.out.dtype;
  auto* out = static_cast<std::uint8_t*>(args.out.data);
  auto* out_t = static_cast<std::uint8_t*>(args.out_transposed.data);
  const bool has_amax = !args.cast.amax.empty();
  const std::int64_t tiles_c = (cols + kTile - 1) / kTile;
  const std::int64_t tiles = tiles_c * ((rows + kTile - 1) / kTile);
  float amax = 0.0f;
  int amax_nan = 0;
#pragma omp parallel for schedule(static) if (parallel_worth(rows * cols)) reduction(max     \
                                                                                     : amax) \
    reduction(|                                                                              \
              : amax_nan)
  for (std::int64_t t = 0; t < tiles; ++t) {
    const std::int64_t r0 = t / tiles_c * kTile, c0 = t % tiles_c * kTile;
    const std::int64_t th = std::min(kTile, rows - r0), tw = std::min(kTile, cols - c0);
    float values[kTile * kTile];
    std::uint8_t codes[kTile * kTile];
    for (std::int64_t r = 0; r < th; ++r)
      decode_into(args.src, (r0 + r) * cols + c0, tw, values + r * tw);
    const auto count = static_cast<std::size_t>(th * tw);
    float local = 0.0f;
    sdk::EncodeOptions options;
    options.scale = args.cast.scale;
    options.overflow = overflow_rule(args.cast.saturate);
    options.amax = has_amax ? &local : nullptr;
    sdk::convert(std::span<const float>(values, count), std::span(codes, count), to, options);
    if (local != local)
      amax_nan = 1;
    else
      amax = std::max(amax, local);
    if (out != nullptr)
      for (std::int64_t r = 0; r < th; ++r)
        std::memcpy(out + (r0 + r) * cols + c0, codes + r * tw, static_cast<std::size_t>(tw));
    if (out_t != nullptr)
      for (std::int64_t c = 0; c < tw; ++c) {
        std::uint8_t* row = out_t + (c0 + c) * rows + r0;
        for (std::int64_t r = 0; r < th; ++r) row[r] = codes[r * tw + c];
      }
  }
  if (has_amax) fold_amax(args.cast.amax, amax, amax_nan != 0);
}

void cast_transpose_gradient(CpuContext& context, const sdk::CastTransposeGradientArgs& args) {
  context.use_threads();
  const auto shape = checks().cast_transpose_gradient_shape(args);
  sdk::CastTransposeArgs cast = args.cast;
  std::vector<std::byte> d;
  if (args.has_activation_grad) {
    // d = src · act'(z), rounded into src's dtype: what activation_backward writes.
    d.resize(cast.src.bytes());
    cast.src.data = d.data();
    apply_activation_grad(context, args.activation, args.pre_activation, args.cast.src, cast.src);
  }
  if (!args.column_sums.empty())
    sum_columns(context, cast.src, shape.rows, shape.cols, args.column_sums.as<float>(),
                args.accumulate_column_sums);
  cast_transpose(context, cast);
}

}  // namespace mixtrain::backend_cpu
