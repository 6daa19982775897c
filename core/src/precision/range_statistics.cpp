// measure_range: exact per-value counts of what each narrow format does to a tensor; see
// range_statistics.h.
#include "mixtrain/core/precision/range_statistics.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <stdexcept>
#include <string>

#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::core {

using sdk::DType;

namespace {

// Bit layout of each format's code, for classifying what an encode produced.
struct CodeLayout {
  std::uint32_t magnitude_mask;  // every bit but the sign
  std::uint32_t overflow;        // the code an overflow gives without saturation (inf, E4M3 NaN)
  int mantissa_bits;
  double max_finite;
};

CodeLayout layout_of(DType format) {
  switch (format) {
    case DType::fp16:
      return {0x7FFF, 0x7C00, 10, 65504.0};
    case DType::bf16:
      return {0x7FFF, 0x7F80, 7, static_cast<double>(sdk::decode_bf16(sdk::kBf16MaxBits))};
    case DType::fp8_e4m3:
      return {0x7F, 0x7F, 3, 448.0};
    case DType::fp8_e5m2:
      return {0x7F, 0x7C, 2, 57344.0};
    default:
      throw std::invalid_argument("range statistics: no narrow format " +
                                  std::string(sdk::dtype_name(format)));
  }
}

bool finite_nonzero(float x) {
  return std::isfinite(x) && x != 0.0f;
}

// Encodes `values` (times `scale`) into `format` without saturation and counts, over the finite
// non-zero inputs, the codes that are ±0, subnormal or the overflow code. `zeros` is how many
// inputs are ±0 and `all_finite` whether no input is NaN or ±inf.
template <class Code>
FormatCounts classify(std::span<const float> values, DType format, float scale,
                      std::vector<Code>& codes, std::int64_t zeros, bool all_finite) {
  const CodeLayout l = layout_of(format);
  codes.resize(values.size());
  sdk::EncodeOptions options;
  options.scale = scale;
  options.overflow = sdk::Overflow::to_inf_or_nan;
  sdk::convert(values, std::span<Code>(codes), format, options);
  FormatCounts c;
  if (all_finite) {
    // A ±0 input (scaled or not) encodes to ±0, so the zero codes of non-zero inputs are all zero
    // codes less the zero inputs, and the loop needs no look at the inputs. 32-bit counters over
    // chunks let the compiler vectorise it.
    const std::uint32_t mask = l.magnitude_mask, overflow = l.overflow;
    // Subnormal codes are 1 .. 2^mantissa_bits - 1: m - 1 below that bound, unsigned (0 wraps).
    const std::uint32_t subnormal_bound = (std::uint32_t{1} << l.mantissa_bits) - 1;
    std::int64_t zero_codes = 0;
    constexpr std::size_t kChunk = std::size_t{1} << 20;
    for (std::size_t begin = 0; begin < codes.size(); begin += kChunk) {
      const std::size_t end = std::min(codes.size(), begin + kChunk);
      std::uint32_t zero = 0, saturated = 0, subnormal = 0;
      for (std::size_t i = begin; i < end; ++i) {
        const std::uint32_t m = static_cast<std::uint32_t>(codes[i]) & mask;
        zero += static_cast<std::uint32_t>(m == 0);
        saturated += static_cast<std::uint32_t>(m >= overflow);
        subnormal += static_cast<std::uint32_t>(m - 1 < subnormal_bound);
      }
      zero_codes += zero;
      c.saturated += saturated;
      c.subnormal += subnormal;
    }
    c.flushed = zero_codes - zeros;
    return c;
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!finite_nonzero(values[i])) continue;
    const std::uint32_t m = static_cast<std::uint32_t>(codes[i]) & l.magnitude_mask;
    if (m == 0)
      ++c.flushed;
    else if (m >= l.overflow)
      ++c.saturated;
    else if ((m >> l.mantissa_bits) == 0)
      ++c.subnormal;
  }
  return c;
}

// floor(log2 a) for a finite a > 0, subnormals included: from the bits, exactly.
int floor_log2(float a) {
  const auto bits = std::bit_cast<std::uint32_t>(a);
  const int exponent = static_cast<int>((bits >> 23) & 0xFFu);
  if (exponent != 0) return exponent - 127;
  return kHistogramMinLog2 + static_cast<int>(std::bit_width(bits & 0x7FFFFFu)) - 1;
}

// 2^k for k in [0, kMaxLossScaleLog2]: multiplying by it is exact (no fp32 overflow for the
// magnitudes below fp16's smallest subnormal it is applied to).
const std::array<float, kMaxLossScaleLog2 + 1>& powers_of_two() {
  static const auto table = [] {
    std::array<float, kMaxLossScaleLog2 + 1> t{};
    for (int k = 0; k <= kMaxLossScaleLog2; ++k)
      t[static_cast<std::size_t>(k)] = std::ldexp(1.0f, k);
    return t;
  }();
  return table;
}

bool survives_fp16(float magnitude, int scale_log2) {
  return (sdk::encode_fp16(magnitude * powers_of_two()[static_cast<std::size_t>(scale_log2)]) &
          0x7FFFu) != 0;
}

// The smallest k in [0, kMaxLossScaleLog2] at which a·2^k (a = |x| > 0, finite) stays non-zero
// in fp16, or kMaxLossScaleLog2 + 1 when none does. From fp16's smallest subnormal 2^-24 up
// every magnitude rounds to a non-zero; below it the exponent gives the candidate (a·2^k flushes
// while it is at most 2^-25, the tie going to the even zero) and the encoder has the last word,
// stepping down and up from it (survival only grows with k).
int fp16_survival_scale_log2(float a) {
  if (a >= 0x1p-24f) return 0;
  int k = std::clamp(-25 - floor_log2(a), 0, kMaxLossScaleLog2 + 1);
  while (k > 0 && survives_fp16(a, k - 1)) --k;
  while (k <= kMaxLossScaleLog2 && !survives_fp16(a, k)) ++k;
  return k;
}

}  // namespace

std::size_t range_format_index(DType format) {
  for (std::size_t i = 0; i < kRangeFormats.size(); ++i)
    if (kRangeFormats[i] == format) return i;
  throw std::invalid_argument("range statistics: no narrow format " +
                              std::string(sdk::dtype_name(format)));
}

float tensor_scale(float amax, DType format) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
  const double scale = layout_of(format).max_finite / static_cast<double>(amax);
  if (scale > static_cast<double>(FLT_MAX)) return FLT_MAX;
  if (scale < static_cast<double>(FLT_MIN)) return FLT_MIN;
  return static_cast<float>(scale);
}

std::int64_t RangeStatistics::fp16_flushed_at_scale_log2(int k) const {
  std::int64_t n = 0;
  for (std::size_t i = static_cast<std::size_t>(std::clamp(k, 0, kMaxLossScaleLog2)) + 1;
       i < fp16_scale_log2.size(); ++i)
    n += fp16_scale_log2[i];
  return n;
}

RangeStatistics measure_range(std::span<const float> values, bool loss_scales) {
  RangeStatistics r;
  r.count = static_cast<std::int64_t>(values.size());
  float min_nonzero = FLT_MAX;
  for (float x : values) {
    if (!std::isfinite(x)) {
      ++r.nonfinite;
      continue;
    }
    if (x == 0.0f) {
      ++r.zeros;
      continue;
    }
    ++r.nonzero;
    const float a = std::fabs(x);
    r.amax = std::max(r.amax, a);
    min_nonzero = std::min(min_nonzero, a);
    ++r.histogram[static_cast<std::size_t>(floor_log2(a) - kHistogramMinLog2)];
    if (loss_scales) ++r.fp16_scale_log2[static_cast<std::size_t>(fp16_survival_scale_log2(a))];
  }
  if (r.nonzero > 0) r.min_nonzero = min_nonzero;
  r.step_amax.push_back(r.amax);
  std::vector<std::uint16_t> codes16;
  std::vector<std::uint8_t> codes8;
  for (std::size_t f = 0; f < kRangeFormats.size(); ++f) {
    const DType format = kRangeFormats[f];
    const float scale = tensor_scale(r.amax, format);
    const bool finite = r.nonfinite == 0;
    if (sdk::dtype_size(format) == 2) {
      r.unscaled[f] = classify(values, format, 1.0f, codes16, r.zeros, finite);
      r.scaled[f] = classify(values, format, scale, codes16, r.zeros, finite);
    } else {
      r.unscaled[f] = classify(values, format, 1.0f, codes8, r.zeros, finite);
      r.scaled[f] = classify(values, format, scale, codes8, r.zeros, finite);
    }
  }
  return r;
}

void merge(RangeStatistics& into, const RangeStatistics& step) {
  if (step.nonzero > 0)
    into.min_nonzero =
        into.nonzero > 0 ? std::min(into.min_nonzero, step.min_nonzero) : step.min_nonzero;
  into.count += step.count;
  into.zeros += step.zeros;
  into.nonfinite += step.nonfinite;
  into.nonzero += step.nonzero;
  into.amax = std::max(into.amax, step.amax);
  into.step_amax.insert(into.step_amax.end(), step.step_amax.begin(), step.step_amax.end());
  for (std::size_t f = 0; f < kRangeFormats.size(); ++f) {
    into.unscaled[f].flushed += step.unscaled[f].flushed;
    into.unscaled[f].subnormal += step.unscaled[f].subnormal;
    into.unscaled[f].saturated += step.unscaled[f].saturated;
    into.scaled[f].flushed += step.scaled[f].flushed;
    into.scaled[f].subnormal += step.scaled[f].subnormal;
    into.scaled[f].saturated += step.scaled[f].saturated;
  }
  for (std::size_t i = 0; i < into.histogram.size(); ++i) into.histogram[i] += step.histogram[i];
  for (std::size_t i = 0; i < into.fp16_scale_log2.size(); ++i)
    into.fp16_scale_log2[i] += step.fp16_scale_log2[i];
}

}  // namespace mixtrain::core
