// measure_range: exact per-value counts of what each narrow format does to a tensor; see
// range_statistics.h.
#include "mixtrain/core/precision/range_statistics.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <stdexcept>
#include <string>

#include "mixtrain/sdk/float_formats.h"

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
// non-zero inputs, the codes that are ±0, subnormal or the overflow code.
template <class Code>
FormatCounts classify(std::span<const float> values, DType format, float scale,
                      std::vector<Code>& codes) {
  const CodeLayout l = layout_of(format);
  codes.resize(values.size());
  sdk::EncodeOptions options;
  options.scale = scale;
  options.overflow = sdk::Overflow::to_inf_or_nan;
  sdk::convert(values, std::span<Code>(codes), format, options);
  FormatCounts c;
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

bool survives_fp16(float magnitude, int scale_log2) {
  return (sdk::encode_fp16(std::ldexp(magnitude, scale_log2)) & 0x7FFFu) != 0;
}

// The smallest k in [0, kMaxLossScaleLog2] at which |x|·2^k stays non-zero in fp16, or
// kMaxLossScaleLog2 + 1 when none does. Survival only grows with k, so a binary search over the
// encoder's answers is exact.
int fp16_survival_scale_log2(float x) {
  const float a = std::fabs(x);
  if (survives_fp16(a, 0)) return 0;
  if (!survives_fp16(a, kMaxLossScaleLog2)) return kMaxLossScaleLog2 + 1;
  int lo = 0, hi = kMaxLossScaleLog2;  // flushes at lo, survives at hi
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (survives_fp16(a, mid) ? hi : lo) = mid;
  }
  return hi;
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
    ++r.histogram[static_cast<std::size_t>(std::ilogb(a) - kHistogramMinLog2)];
    if (loss_scales) ++r.fp16_scale_log2[static_cast<std::size_t>(fp16_survival_scale_log2(x))];
  }
  if (r.nonzero > 0) r.min_nonzero = min_nonzero;
  r.step_amax.push_back(r.amax);
  std::vector<std::uint16_t> codes16;
  std::vector<std::uint8_t> codes8;
  for (std::size_t f = 0; f < kRangeFormats.size(); ++f) {
    const DType format = kRangeFormats[f];
    const float scale = tensor_scale(r.amax, format);
    if (sdk::dtype_size(format) == 2) {
      r.unscaled[f] = classify(values, format, 1.0f, codes16);
      r.scaled[f] = classify(values, format, scale, codes16);
    } else {
      r.unscaled[f] = classify(values, format, 1.0f, codes8);
      r.scaled[f] = classify(values, format, scale, codes8);
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
