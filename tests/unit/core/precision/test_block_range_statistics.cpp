// Block range statistics against a brute-force count from the SDK's reference quantizer
// (quantize_block_scaled / dequantize_block_scaled) on random tensors of wide range and on
// constructed ones (an outlier row, an outlier tile), and the per-tensor counts against
// measure_range's scaled e4m3 counts, an independent implementation of the same scale.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "mixtrain/core/precision/block_range_statistics.h"
#include "mixtrain/core/precision/range_statistics.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::core {
namespace {

using sdk::BlockElement;

// The element's largest magnitude code and the factor above the max at which a value rounds past
// it (E4M3: 448 to 464, whose tie goes to 448; E2M1: 6 to 7, whose tie goes up).
struct ElementTop {
  std::uint8_t max_code, magnitude_mask;
  double overflow_ratio;
  bool tie_overflows;
};

ElementTop top_of(BlockElement e) {
  return e == BlockElement::e2m1 ? ElementTop{0x7, 0x7, 7.0 / 6.0, true}
                                 : ElementTop{0x7E, 0x7F, 464.0 / 448.0, false};
}

// Brute force: quantize with the reference, dequantize, and count per value.
BlockCounts reference_counts(const std::vector<float>& x, std::int64_t rows, std::int64_t cols,
                             const sdk::BlockScaledLayout& layout) {
  const sdk::BlockScaledTensor q = sdk::quantize_block_scaled(x, rows, cols, layout);
  const std::vector<float> dq = sdk::dequantize_block_scaled(q);
  const ElementTop top = top_of(layout.element);
  BlockCounts c;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i] == 0.0f) continue;
    if (dq[i] == 0.0f) ++c.flushed;
    // A clamped value: the max code, and the value past the max's rounding range.
    if ((q.codes[i] & top.magnitude_mask) == top.max_code) {
      const double ratio =
          std::fabs(static_cast<double>(x[i])) / std::fabs(static_cast<double>(dq[i]));
      if (ratio > top.overflow_ratio || (top.tie_overflows && ratio == top.overflow_ratio))
        ++c.saturated;
    }
  }
  return c;
}

// Signed log-uniform values over [10^lo, 10^hi].
std::vector<float> wide(std::size_t n, double lo, double hi, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> e(lo, hi);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>((i % 3 == 0 ? -1.0 : 1.0) * std::pow(10.0, e(gen)));
  return v;
}

void expect_counts(const BlockCounts& got, const BlockCounts& want, const char* what) {
  EXPECT_EQ(got.flushed, want.flushed) << what;
  EXPECT_EQ(got.saturated, want.saturated) << what;
}

TEST(BlockRangeStatistics, PerBlockCountsMatchTheReferenceQuantizer) {
  // 70 x 300: partial blocks along both dims for every layout; 8 decades of range, zeros too.
  const std::int64_t rows = 70, cols = 300;
  std::vector<float> x = wide(static_cast<std::size_t>(rows * cols), -6.0, 2.0, 11);
  for (std::size_t i = 0; i < x.size(); i += 17) x[i] = 0.0f;
  for (BlockFormat f : kBlockFormats)
    for (BlockRole role : {BlockRole::activation, BlockRole::weight}) {
      const auto layout = block_layout(f, role);
      const BlockCounts want = reference_counts(x, rows, cols, layout);
      expect_counts(count_per_block(x, rows, cols, layout), want, block_format_name(f));
      // Not vacuous: 8 decades flush somewhere in every format.
      EXPECT_GT(want.flushed, 0) << block_format_name(f);
    }
  // The rules the policies' options select too: power-of-two fp32 scales, the OCP MX floor rule
  // (which saturates the values between the max and the next power of two).
  for (const auto& layout :
       {sdk::fp8_block_layout(sdk::ReductionAxis::cols, BlockElement::e4m3, true),
        sdk::mx_layout(sdk::ReductionAxis::cols, BlockElement::e4m3),
        sdk::BlockScaledLayout{BlockElement::e4m3, sdk::BlockScale::e8m0, 1, 32, false},
        sdk::BlockScaledLayout{BlockElement::e2m1, sdk::BlockScale::e8m0, 1, 32, false}})
    expect_counts(count_per_block(x, rows, cols, layout), reference_counts(x, rows, cols, layout),
                  sdk::describe(layout).c_str());
  const sdk::BlockScaledLayout ocp{BlockElement::e4m3, sdk::BlockScale::e8m0, 1, 32, false};
  EXPECT_GT(reference_counts(x, rows, cols, ocp).saturated, 0);
}

// One outlier row: one per-tensor scale flushes the other rows, 1-D blocks along the row keep
// each row to itself. The rows span half a decade, which E2M1's elements (6 down to 0.25 within a
// block) hold too. NVFP4's E4M3 block scales span 448 / 2^-9 under the tensor's amax: an outlier
// 1e5 times the rest fits, one 1e6 times does not, and then the other rows' scales flush.
std::vector<float> outlier_row(std::int64_t rows, std::int64_t cols, float factor) {
  std::vector<float> x = wide(static_cast<std::size_t>(rows * cols), -0.5, 0.0, 5);
  for (std::int64_t c = 0; c < cols; ++c) x[static_cast<std::size_t>(3 * cols + c)] *= factor;
  return x;
}

TEST(BlockRangeStatistics, AnOutlierRowFlushesPerTensorNotPerBlock) {
  const std::int64_t rows = 64, cols = 256;
  const std::size_t nvfp4 = 2;
  for (const float factor : {1e5f, 1e6f}) {
    const std::vector<float> x = outlier_row(rows, cols, factor);
    const BlockRangeStatistics s = measure_blocks(x, rows, cols, BlockRole::activation);
    EXPECT_EQ(s.nonzero, rows * cols);
    for (std::size_t f = 0; f < kBlockFormats.size(); ++f) {
      const auto layout = block_layout(kBlockFormats[f], BlockRole::activation);
      expect_counts(s.per_block[f], reference_counts(x, rows, cols, layout),
                    block_format_name(kBlockFormats[f]));
    }
    // fp8-block's fp32 scales put each block's amax on 448, mxfp8's round-up rule at most there:
    // nothing saturates.
    EXPECT_EQ(s.per_block[0].saturated, 0);
    EXPECT_EQ(s.per_block[1].saturated, 0);
    if (factor == 1e5f) {
      // E4M3 per tensor: the other rows land on subnormals, most of them not yet on 0.
      EXPECT_GT(s.share(s.per_tensor[nvfp4].flushed), 0.9);
      EXPECT_LT(s.share(s.per_block[nvfp4].flushed), 0.01);
    } else {
      for (std::size_t f : {std::size_t{0}, std::size_t{1}}) {
        EXPECT_GT(s.share(s.per_tensor[f].flushed), 0.9) << block_format_name(kBlockFormats[f]);
        EXPECT_LT(s.share(s.per_block[f].flushed), 0.01) << block_format_name(kBlockFormats[f]);
      }
      EXPECT_GT(s.share(s.per_block[nvfp4].flushed), 0.9);
    }
  }
}

// A weight with one hot 128 x 128 tile: the 2-D layouts isolate it.
TEST(BlockRangeStatistics, AnOutlierTileFlushesPerTensorNotPerBlock) {
  const std::int64_t rows = 256, cols = 256;
  std::vector<float> x = wide(static_cast<std::size_t>(rows * cols), -2.0, 0.0, 9);
  for (std::int64_t r = 128; r < 256; ++r)
    for (std::int64_t c = 0; c < 128; ++c) x[static_cast<std::size_t>(r * cols + c)] *= 1e5f;
  const BlockRangeStatistics s = measure_blocks(x, rows, cols, BlockRole::weight);
  for (std::size_t f = 0; f < kBlockFormats.size(); ++f) {
    expect_counts(
        s.per_block[f],
        reference_counts(x, rows, cols, block_layout(kBlockFormats[f], BlockRole::weight)),
        block_format_name(kBlockFormats[f]));
    EXPECT_GT(s.per_tensor[f].flushed, s.per_block[f].flushed);
  }
  EXPECT_LT(s.share(s.per_block[0].flushed), 0.01);
}

// Per tensor in e4m3 is range_statistics' scaled e4m3 (the same scale, counted by another path);
// e2m1 against its encoder directly.
TEST(BlockRangeStatistics, PerTensorCountsMatchTheScaledFormats) {
  std::vector<float> x = wide(20000, -7.0, 3.0, 3);
  const RangeStatistics r = measure_range(x);
  const FormatCounts& e4m3 = r.scaled[range_format_index(sdk::DType::fp8_e4m3)];
  const BlockCounts t = count_per_tensor(x, BlockElement::e4m3);
  EXPECT_EQ(t.flushed, e4m3.flushed);
  EXPECT_EQ(t.saturated, e4m3.saturated);
  EXPECT_GT(t.flushed, 0);

  const float scale = static_cast<float>(6.0 / static_cast<double>(r.amax));
  BlockCounts want;
  for (float v : x) {
    const float y = v * scale;
    if (sdk::decode_fp4_e2m1(sdk::encode_fp4_e2m1(y)) == 0.0f) ++want.flushed;
    if (std::fabs(y) >= 7.0f) ++want.saturated;
  }
  expect_counts(count_per_tensor(x, BlockElement::e2m1), want, "e2m1");
}

TEST(BlockRangeStatistics, NonFiniteTensorsAreSkippedAndSizesChecked) {
  std::vector<float> x(256, 1.0f);
  x[7] = std::nanf("");
  const BlockRangeStatistics s = measure_blocks(x, 2, 128, BlockRole::activation);
  EXPECT_EQ(s.skipped, 1);
  EXPECT_EQ(s.nonzero, 0);
  EXPECT_THROW(measure_blocks(x, 3, 128, BlockRole::activation), std::invalid_argument);
  BlockRangeStatistics total =
      measure_blocks(std::vector<float>(128, 2.0f), 1, 128, BlockRole::activation);
  merge(total, s);
  EXPECT_EQ(total.nonzero, 128);
  EXPECT_EQ(total.skipped, 1);
}

}  // namespace
}  // namespace mixtrain::core
