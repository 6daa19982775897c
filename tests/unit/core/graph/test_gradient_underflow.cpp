// underflow_threshold: the underflow pass counts a gradient value as flushed when its magnitude is
// at most the dtype's threshold, where it used to encode and decode each value. The threshold is
// the formats' own (half the smallest subnormal: round to nearest even takes that tie to zero), and
// the compare agrees with the encoders on values of every magnitude near it.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::core {
namespace {

using sdk::DType;

bool stored_as_zero(float v, DType dt) {
  switch (dt) {
    case DType::fp16:
      return sdk::decode_fp16(sdk::encode_fp16(v)) == 0.0f;
    case DType::bf16:
      return sdk::decode_bf16(sdk::encode_bf16(v)) == 0.0f;
    case DType::fp8_e4m3:
      return sdk::decode_fp8_e4m3(sdk::encode_fp8_e4m3(v, sdk::Overflow::saturate)) == 0.0f;
    case DType::fp8_e5m2:
      return sdk::decode_fp8_e5m2(sdk::encode_fp8_e5m2(v, sdk::Overflow::saturate)) == 0.0f;
    default:
      return false;
  }
}

TEST(UnderflowThreshold, IsHalfTheSmallestSubnormalOfEachFormat) {
  EXPECT_EQ(underflow_threshold(DType::bf16), std::ldexp(1.0f, -134));     // 2^-133 / 2
  EXPECT_EQ(underflow_threshold(DType::fp16), std::ldexp(1.0f, -25));      // 2^-24 / 2
  EXPECT_EQ(underflow_threshold(DType::fp8_e4m3), std::ldexp(1.0f, -10));  // 2^-9 / 2
  EXPECT_EQ(underflow_threshold(DType::fp8_e5m2), std::ldexp(1.0f, -17));  // 2^-16 / 2
  EXPECT_EQ(underflow_threshold(DType::fp32), 0.0f);  // keeps every non-zero float
}

TEST(UnderflowThreshold, TheCompareAgreesWithTheEncodersAtEveryMagnitudeNearIt) {
  std::mt19937 gen(7);
  for (const DType dt : {DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2}) {
    const float t = underflow_threshold(dt);
    const float inf = std::numeric_limits<float>::infinity();
    // Its neighbours, either sign.
    for (const float v : {t, std::nextafter(t, inf), std::nextafter(t, 0.0f)}) {
      EXPECT_EQ(std::fabs(v) <= t, stored_as_zero(v, dt)) << v;
      EXPECT_EQ(std::fabs(-v) <= t, stored_as_zero(-v, dt)) << -v;
    }
    // Random bit patterns within 2^±8 of it, and across the fp32 subnormals.
    std::uniform_int_distribution<std::int32_t> shift(-8 << 23, 8 << 23);
    std::uniform_int_distribution<std::uint32_t> subnormal(1, 0x007fffffu);
    for (int i = 0; i < 20000; ++i) {
      const auto bits = static_cast<std::uint32_t>(
          static_cast<std::int32_t>(std::bit_cast<std::uint32_t>(t)) + shift(gen));
      for (const float v : {std::bit_cast<float>(bits), std::bit_cast<float>(subnormal(gen))})
        ASSERT_EQ(std::fabs(v) <= t, stored_as_zero(v, dt)) << v << " " << sdk::dtype_name(dt);
    }
  }
}

}  // namespace
}  // namespace mixtrain::core
