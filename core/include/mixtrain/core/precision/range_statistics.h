// Range statistics of one tensor: what storing its values in each narrow format would do to them,
// counted value by value with the SDK's exact encoders (sdk/float_formats.h).
//
// Contract
// - measure_range() reads a span of fp32 values (any length, empty included) and never throws.
//   Zeros are counted apart; NaN and ±inf are counted as non-finite and take part in nothing
//   else. The other values are the finite non-zero ones: every share below is of those.
// - Per format (fp16, bf16, fp8_e4m3, fp8_e5m2, in kRangeFormats order), for each value stored
//   unscaled and stored with per-tensor scaling: `flushed` rounds to ±0, `subnormal` lands on a
//   non-zero subnormal of the format, `saturated` exceeds its largest finite value (what an
//   encode with Overflow::to_inf_or_nan turns into inf, or E4M3's NaN).
// - Per-tensor scaling multiplies every value by tensor_scale(amax, format) — the fp8 plugin's
//   current-scaling formula with margin 0 (plugins/fp8/fp8_recipe.h, compute_scale): the format's
//   largest finite value over amax, in double, rounded once to float and clamped to
//   [FLT_MIN, FLT_MAX]; 1 when amax is 0 or not finite — then rounds x·scale in fp32 and encodes,
//   as the bulk conversions do.
// - The histogram counts the finite non-zero values by floor(log2|x|), which for fp32 lies in
//   [kHistogramMinLog2, kHistogramMaxLog2] (subnormals included): bin b holds 2^b <= |x| < 2^(b+1).
// - fp16_scale_log2[k] (k in 0..24) counts the values that stay non-zero in fp16 at a power-of-two
//   loss scale 2^k but flush at 2^(k-1) (k = 0: those that survive unscaled); index 25 counts
//   those that flush even at 2^24. A power-of-two scale is exact in fp32, so flushed_at(2^k) is
//   exactly the sum of the bins above k. Computed only when asked (gradients), else all zero.
// - merge() adds a later measurement (one step's) into an aggregate: counts add, amax is the max,
//   step_amax appends, min_nonzero is the min.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "mixtrain/sdk/dtype.h"

namespace mixtrain::core {

inline constexpr std::array<sdk::DType, 4> kRangeFormats = {
    sdk::DType::fp16, sdk::DType::bf16, sdk::DType::fp8_e4m3, sdk::DType::fp8_e5m2};
inline constexpr int kHistogramMinLog2 = -149;  // fp32's smallest subnormal, 2^-149
inline constexpr int kHistogramMaxLog2 = 127;   // fp32's largest binade
inline constexpr int kMaxLossScaleLog2 = 24;    // the loss scales tracked: 2^0 .. 2^24

struct FormatCounts {
  std::int64_t flushed = 0, subnormal = 0, saturated = 0;
};

struct RangeStatistics {
  std::int64_t count = 0;        // every value seen
  std::int64_t zeros = 0;        // exact ±0
  std::int64_t nonfinite = 0;    // NaN, ±inf
  std::int64_t nonzero = 0;      // finite and non-zero: the base of every share
  float amax = 0.0f;             // max |x| over the finite values
  float min_nonzero = 0.0f;      // min |x| over the finite non-zero values (0: none)
  std::vector<float> step_amax;  // one amax per merged measurement, in order
  // Indexed like kRangeFormats.
  std::array<FormatCounts, kRangeFormats.size()> unscaled{}, scaled{};
  std::vector<std::int64_t> histogram =
      std::vector<std::int64_t>(kHistogramMaxLog2 - kHistogramMinLog2 + 1, 0);
  std::array<std::int64_t, kMaxLossScaleLog2 + 2> fp16_scale_log2{};

  // Shares of `nonzero` (0 when there are none).
  double share(std::int64_t n) const {
    return nonzero > 0 ? static_cast<double>(n) / static_cast<double>(nonzero) : 0.0;
  }
  // Values that flush in fp16 at loss scale 2^k (needs fp16_scale_log2).
  std::int64_t fp16_flushed_at_scale_log2(int k) const;
};

// The index of `format` in kRangeFormats; std::invalid_argument for any other dtype.
std::size_t range_format_index(sdk::DType format);
// The per-tensor scale described above.
float tensor_scale(float amax, sdk::DType format);

RangeStatistics measure_range(std::span<const float> values, bool loss_scales = false);
void merge(RangeStatistics& into, const RangeStatistics& step);

}  // namespace mixtrain::core
