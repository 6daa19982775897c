// The block-scaled weight decode (contract in cpu_block_scaled_decode.h).
#include "cpu_block_scaled_decode.h"

#include <algorithm>
#include <vector>

#include "cpu_access.h"
#include "cpu_isa.h"

namespace mixtrain::backend_cpu {

namespace {

// y [cols] = row r's elements, the first at element index `first` of the codes: per run of
// block_cols elements (one scale), value · (scale · tensor_scale) in double, rounded to fp32.
// Without a tensor scale (every frozen base's layout) the product has one factor besides the
// value, and fp32's own multiply rounds it once, as the exact double product rounded to fp32
// does: the same bits at twice the lanes.
template <bool kPacked, bool kTensorScale>
[[gnu::always_inline]] inline void decode_row(const std::uint8_t* codes, std::int64_t first,
                                              std::int64_t cols, const float* values,
                                              const float* row_scales, std::int64_t block_cols,
                                              double tensor_scale, float* y) {
  for (std::int64_t c0 = 0, b = 0; c0 < cols; c0 += block_cols, ++b) {
    const std::int64_t c1 = std::min(cols, c0 + block_cols);
    const double s = static_cast<double>(row_scales[b]) * tensor_scale;
    const float s1 = row_scales[b];
#pragma omp simd
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t i = first + c;
      const unsigned code =
          kPacked ? (codes[i >> 1] >> (4 * (i & 1))) & 0xFu : static_cast<unsigned>(codes[i]);
      if constexpr (kTensorScale)
        y[c] = static_cast<float>(static_cast<double>(values[code]) * s);
      else
        y[c] = values[code] * s1;
    }
  }
}

[[gnu::always_inline]] inline void decode_one_row(const std::uint8_t* codes, bool packed,
                                                  std::int64_t first, std::int64_t cols,
                                                  const float* values, const float* row_scales,
                                                  std::int64_t block_cols, double tensor_scale,
                                                  float* y) {
  const bool scaled = tensor_scale != 1.0;
  if (packed && scaled)
    decode_row<true, true>(codes, first, cols, values, row_scales, block_cols, tensor_scale, y);
  else if (packed)
    decode_row<true, false>(codes, first, cols, values, row_scales, block_cols, tensor_scale, y);
  else if (scaled)
    decode_row<false, true>(codes, first, cols, values, row_scales, block_cols, tensor_scale, y);
  else
    decode_row<false, false>(codes, first, cols, values, row_scales, block_cols, tensor_scale, y);
}

MIXTRAIN_ISA_VARIANTS(decode_one_row)

}  // namespace

void decode_block_scaled(const std::uint8_t* codes, bool packed,
                         const std::array<float, 256>& values, const float* scales,
                         std::int64_t grid_cols, std::int64_t block_rows, std::int64_t block_cols,
                         float tensor_scale, const sdk::TensorView& out) {
  const std::int64_t rows = out.shape[0], cols = out.shape[1];
  const double ts = tensor_scale;
#pragma omp parallel if (parallel_worth(rows * cols))
  {
    std::vector<float> buf;  // a 16-bit row in fp32, one per thread for all its rows
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      float* y = row_target(out, r, cols, buf);
      decode_one_row_best(codes, packed, r * cols, cols, values.data(),
                          scales + (r / block_rows) * grid_cols, block_cols, ts, y);
      commit_row(out, r, cols, y);
    }
  }
}

}  // namespace mixtrain::backend_cpu
