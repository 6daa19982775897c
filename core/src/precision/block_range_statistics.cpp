// measure_blocks: exact counts of what block-scaled quantization does to a tensor; see
// block_range_statistics.h. The blocks' scales are quantize_block_scaled's own
// (sdk::block_encodings); the elements are classified with the same rounding rule
// (format_rules::round_scaled_magnitude), which tells an overflow apart from the max that a
// saturating encode returns for both.
#include "mixtrain/core/precision/block_range_statistics.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/sdk/support/float_format_rules.h"

namespace mixtrain::core {

namespace fr = sdk::format_rules;
using sdk::BlockElement;
using sdk::BlockScaledLayout;

namespace {

// How one value was encoded: its fp32 product with the block's scale, then an exact 2^k.
template <class F>
void classify(float v, int k, BlockCounts& c) {
  const fr::u32 a = fr::bits_of(v) & 0x7FFFFFFFu;
  if (a == 0) {
    ++c.flushed;  // x·scale underflowed fp32 itself, or the block's scale is 0 (nvfp4)
    return;
  }
  if (a >= 0x7F800000u) {
    ++c.saturated;
    return;
  }
  const fr::u32 m = fr::round_scaled_magnitude<F, false>(a, k, 0);
  if (m == 0)
    ++c.flushed;
  else if (m > F::kMax)
    ++c.saturated;
}

bool finite_nonzero(float x) {
  return std::isfinite(x) && x != 0.0f;
}

template <class F>
float element_max() {
  return fr::decode<F>(F::kMax);
}

template <class F>
BlockCounts per_block(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                      const BlockScaledLayout& layout) {
  const sdk::BlockExtent grid = sdk::block_grid(layout, rows, cols);
  const sdk::BlockEncodings encodings = sdk::block_encodings(x, rows, cols, layout);
  BlockCounts counts;
  for (std::int64_t bi = 0; bi < grid.rows; ++bi)
    for (std::int64_t bj = 0; bj < grid.cols; ++bj) {
      const sdk::BlockEncoding& enc =
          encodings.blocks[static_cast<std::size_t>(bi * grid.cols + bj)];
      const std::int64_t r0 = bi * layout.block_rows, c0 = bj * layout.block_cols;
      const std::int64_t r1 = std::min(rows, r0 + layout.block_rows);
      const std::int64_t c1 = std::min(cols, c0 + layout.block_cols);
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t c = c0; c < c1; ++c) {
          const float v = x[static_cast<std::size_t>(r * cols + c)];
          if (v == 0.0f) continue;
          classify<F>(enc.encode_scale == 1.0f ? v : v * enc.encode_scale, enc.pow2_shift, counts);
        }
    }
  return counts;
}

template <class F>
BlockCounts per_tensor(std::span<const float> x) {
  float amax = 0.0f;
  for (float v : x)
    if (std::isfinite(v)) amax = std::max(amax, std::fabs(v));
  float scale = 1.0f;
  if (amax > 0.0f) {
    const double s = static_cast<double>(element_max<F>()) / static_cast<double>(amax);
    scale = static_cast<float>(
        std::clamp(s, static_cast<double>(FLT_MIN), static_cast<double>(FLT_MAX)));
  }
  BlockCounts counts;
  for (float v : x)
    if (finite_nonzero(v)) classify<F>(v * scale, 0, counts);
  return counts;
}

void check_size(std::span<const float> x, std::int64_t rows, std::int64_t cols) {
  if (rows < 0 || cols < 0 ||
      static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(cols) !=
          static_cast<std::uint64_t>(x.size()))
    throw std::invalid_argument("block range statistics: a " + std::to_string(rows) + " x " +
                                std::to_string(cols) + " tensor was given " +
                                std::to_string(x.size()) + " values");
}

}  // namespace

const char* block_format_name(BlockFormat f) {
  switch (f) {
    case BlockFormat::fp8_block:
      return "fp8-block";
    case BlockFormat::mxfp8:
      return "mxfp8";
    case BlockFormat::nvfp4:
      return "nvfp4";
  }
  return "?";
}

const char* block_element_name(BlockFormat f) {
  return f == BlockFormat::nvfp4 ? "e2m1" : "e4m3";
}

BlockScaledLayout block_layout(BlockFormat f, BlockRole role) {
  const bool weight = role == BlockRole::weight;
  switch (f) {
    case BlockFormat::fp8_block:
      return weight ? sdk::fp8_block_weight_layout()
                    : sdk::fp8_block_layout(sdk::ReductionAxis::cols);
    case BlockFormat::mxfp8:  // the policy's default scale_rule
      return sdk::mx_layout(sdk::ReductionAxis::cols, BlockElement::e4m3,
                            sdk::MxScaleRule::round_up);
    case BlockFormat::nvfp4:
      return weight ? sdk::nvfp4_weight_layout() : sdk::nvfp4_layout(sdk::ReductionAxis::cols);
  }
  throw std::invalid_argument("block range statistics: unknown block format");
}

BlockCounts count_per_block(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                            const BlockScaledLayout& layout) {
  check_size(x, rows, cols);
  switch (layout.element) {
    case BlockElement::e4m3:
      return per_block<fr::E4M3>(x, rows, cols, layout);
    case BlockElement::e5m2:
      return per_block<fr::E5M2>(x, rows, cols, layout);
    case BlockElement::e2m1:
      return per_block<fr::E2M1>(x, rows, cols, layout);
  }
  throw std::invalid_argument("block range statistics: unknown element format");
}

BlockCounts count_per_tensor(std::span<const float> x, BlockElement element) {
  switch (element) {
    case BlockElement::e4m3:
      return per_tensor<fr::E4M3>(x);
    case BlockElement::e5m2:
      return per_tensor<fr::E5M2>(x);
    case BlockElement::e2m1:
      return per_tensor<fr::E2M1>(x);
  }
  throw std::invalid_argument("block range statistics: unknown element format");
}

BlockLayouts default_block_layouts(BlockRole role) {
  BlockLayouts out{};
  for (std::size_t f = 0; f < kBlockFormats.size(); ++f)
    out[f] = block_layout(kBlockFormats[f], role);
  return out;
}

BlockRangeStatistics measure_blocks(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                                    BlockRole role) {
  return measure_blocks(x, rows, cols, default_block_layouts(role));
}

BlockRangeStatistics measure_blocks(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                                    const BlockLayouts& layouts) {
  check_size(x, rows, cols);
  BlockRangeStatistics s;
  for (float v : x)
    if (!std::isfinite(v)) {
      s.skipped = 1;
      return s;
    }
  for (float v : x) s.nonzero += v != 0.0f ? 1 : 0;
  if (s.nonzero == 0) return s;
  for (std::size_t f = 0; f < kBlockFormats.size(); ++f) {
    const BlockScaledLayout& layout = layouts[f];
    s.per_tensor[f] = count_per_tensor(x, layout.element);
    s.per_block[f] = count_per_block(x, rows, cols, layout);
  }
  return s;
}

void merge(BlockRangeStatistics& into, const BlockRangeStatistics& step) {
  into.nonzero += step.nonzero;
  into.skipped += step.skipped;
  for (std::size_t f = 0; f < kBlockFormats.size(); ++f) {
    into.per_tensor[f].flushed += step.per_tensor[f].flushed;
    into.per_tensor[f].saturated += step.per_tensor[f].saturated;
    into.per_block[f].flushed += step.per_block[f].flushed;
    into.per_block[f].saturated += step.per_block[f].saturated;
  }
}

BlockShares normal_block_shares(const BlockScaledLayout& layout) {
  static std::mutex mutex;
  static std::vector<std::pair<BlockScaledLayout, BlockShares>> measured;
  const std::lock_guard<std::mutex> lock(mutex);
  for (const auto& [l, shares] : measured)
    if (l == layout) return shares;
  constexpr std::int64_t rows = 256, cols = 1024;  // whole blocks of every recipe's layout
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  std::mt19937 draw(20260101);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(draw);
  const BlockCounts c = count_per_block(x, rows, cols, layout);
  const double n = static_cast<double>(x.size());
  const BlockShares shares{static_cast<double>(c.flushed) / n,
                           static_cast<double>(c.saturated) / n};
  measured.emplace_back(layout, shares);
  return shares;
}

}  // namespace mixtrain::core
