// Format conversions: RNE ties, subnormals, overflow vs saturation, NaN, tf32 rounding, and the
// backend's cast() with scale and fused amax. Exhaustive over every fp16 / bf16 bit pattern.
#include <algorithm>
#include <bit>
#include <limits>

#include "backend_test_util.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cpu::testing {
namespace {

float f(std::uint32_t bits) { return std::bit_cast<float>(bits); }

TEST(backend_cpu_numerics, Fp16RoundToNearestEvenAndRanges) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(float_to_fp16(1.0f + 0x1p-11f), 0x3C00);          // tie -> even (down)
  EXPECT_EQ(float_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);      // tie -> even (up)
  EXPECT_EQ(float_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);  // above the tie
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7C00);  // tie at the top rounds to inf
  EXPECT_EQ(float_to_fp16(65520.0f, true), 0x7BFF);
  EXPECT_EQ(float_to_fp16(-1e6f), 0xFC00);
  EXPECT_EQ(float_to_fp16(-1e6f, true), 0xFBFF);
  EXPECT_EQ(float_to_fp16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(float_to_fp16(std::numeric_limits<float>::infinity(), true), 0x7BFF);
  const std::uint16_t nan = float_to_fp16(std::numeric_limits<float>::quiet_NaN(), true);
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
  // Subnormals: units of 2^-24.
  EXPECT_EQ(float_to_fp16(0x1p-24f), 0x0001);
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000);          // tie -> even (zero)
  EXPECT_EQ(float_to_fp16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(float_to_fp16(0x1.8p-24f), 0x0002);        // 1.5 units: tie -> even (2)
  EXPECT_EQ(float_to_fp16(0x1.4p-24f), 0x0001);
  EXPECT_EQ(float_to_fp16(-0x1p-24f), 0x8001);
  EXPECT_EQ(float_to_fp16(0x1p-14f), 0x0400);          // min normal
  EXPECT_EQ(float_to_fp16(0x1.ff8p-15f), 0x03FF);      // largest subnormal 1023 * 2^-24
  EXPECT_EQ(float_to_fp16(0x1.ffcp-15f), 0x0400);      // 1023.5 units: tie -> even (1024)
  EXPECT_EQ(float_to_fp16(1e-30f), 0x0000);
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_fp16(f(0x00000001)), 0x0000);     // fp32 subnormal
}

// Nearest fp16 by brute force over the sorted positive values, ties to the even pattern.
std::uint16_t reference_fp16(float x) {
  static const std::vector<double> positives = [] {
    std::vector<double> v;
    for (std::uint32_t b = 0; b <= 0x7BFF; ++b) v.push_back(fp16_to_float(static_cast<std::uint16_t>(b)));
    return v;
  }();
  const double a = std::fabs(static_cast<double>(x));
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (a >= 65520.0) return sign | 0x7C00;
  const auto it = std::lower_bound(positives.begin(), positives.end(), a);
  if (it == positives.end()) return sign | 0x7BFF;  // (65504, 65520): nearer the max finite
  auto hi = static_cast<std::uint16_t>(it - positives.begin());
  if (positives[hi] == a) return sign | hi;
  const auto lo = static_cast<std::uint16_t>(hi - 1);
  const double dl = a - positives[lo], dh = positives[hi] - a;
  if (dl < dh) return sign | lo;
  if (dh < dl) return sign | hi;
  return sign | ((lo & 1) == 0 ? lo : hi);
}

TEST(backend_cpu_numerics, Fp16MatchesBruteForceNearestOnRandomFloats) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> mantissa(0, 0x7FFFFFu);
  std::uniform_int_distribution<std::uint32_t> exponent(127 - 30, 127 + 16);  // 2^-30 .. 2^17
  std::uniform_int_distribution<std::uint32_t> sign(0, 1);
  for (int i = 0; i < 200000; ++i) {
    const float x = f((sign(rng) << 31) | (exponent(rng) << 23) | mantissa(rng));
    ASSERT_EQ(float_to_fp16(x), reference_fp16(x)) << std::hexfloat << x;
  }
}

TEST(backend_cpu_numerics, EveryFp16AndBf16PatternRoundTrips) {
  for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float x = fp16_to_float(h);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(x))));
    } else {
      ASSERT_EQ(float_to_fp16(x), h) << b;
    }
    const float y = bf16_to_float(h);
    if (std::isnan(y)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(y))));
    } else {
      ASSERT_EQ(float_to_bf16(y), h) << b;
    }
  }
}

TEST(backend_cpu_numerics, Bf16RoundToNearestEvenAndOverflow) {
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3F80);      // tie -> even (down)
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max(), true), 0x7F7F);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity(), true), 0xFF7F);
  EXPECT_EQ(float_to_bf16(f(0x00010000)), 0x0001);  // fp32 subnormal stays subnormal
  EXPECT_EQ(float_to_bf16(f(0x00008000)), 0x0000);  // tie -> even
  EXPECT_EQ(float_to_bf16(f(0x00018000)), 0x0002);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f(0x7F800001)))));  // signalling payload low
}

TEST(backend_cpu_numerics, NaNsStayQuietNaNsWithSignAndTopPayload) {
  const float signalling = f(0xFF812345u);  // negative sNaN with payload
  EXPECT_EQ(float_to_bf16(signalling), 0xFFC1);
  EXPECT_EQ(float_to_fp16(signalling), 0xFE00 | ((0xFF812345u >> 13) & 0x3FF));
  EXPECT_EQ(std::bit_cast<std::uint32_t>(round_to_tf32(signalling)), (0xFF812345u | 0x400000u) & ~0x1FFFu);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(fp16_to_float(0x7D01)), 0x7FC00000u | (0x101u << 13));
  EXPECT_EQ(std::bit_cast<std::uint32_t>(bf16_to_float(0xFF81)), 0xFFC10000u);
  EXPECT_EQ(float_to_bf16(signalling, true), 0xFFC1);  // saturation never turns NaN into a number
}

TEST(backend_cpu_numerics, Tf32KeepsTenMantissaBitsWithTiesToEven) {
  EXPECT_EQ(round_to_tf32(1.0f + 0x1p-11f), 1.0f);
  EXPECT_EQ(round_to_tf32(1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);
  EXPECT_EQ(round_to_tf32(1.0f + 0x1p-11f + 0x1p-23f), 1.0f + 0x1p-10f);
  EXPECT_EQ(round_to_tf32(1.0f + 0x1p-12f), 1.0f);
  EXPECT_EQ(round_to_tf32(-3.0f), -3.0f);
  EXPECT_TRUE(std::isinf(round_to_tf32(std::numeric_limits<float>::max())));
  EXPECT_TRUE(std::isnan(round_to_tf32(std::numeric_limits<float>::quiet_NaN())));
  for (float x : random_values(1000, 3, -100.0f, 100.0f)) {
    const float r = round_to_tf32(x);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(r) & 0x1FFFu, 0u);
    EXPECT_LE(std::fabs(r - x), std::fabs(x) * 0x1p-11f);
  }
}

TEST(backend_cpu_cast, Fp32ToHalfAndBackThroughTheBackend) {
  CpuBackend be(2);
  const std::vector<float> values = {1.0f + 0x1p-11f, 65520.0f, -1e6f, 0x1p-25f, 0x1.8p-24f,
                                     std::numeric_limits<float>::infinity(), -2.5f};
  DeviceTensor src(be, DType::fp32, {7}, values);
  DeviceTensor h(be, DType::fp16, {7});
  be.cast(src, h);
  const auto* bits = h.view().as<std::uint16_t>();
  EXPECT_EQ(bits[0], 0x3C00);
  EXPECT_EQ(bits[1], 0x7C00);
  EXPECT_EQ(bits[2], 0xFC00);
  EXPECT_EQ(bits[3], 0x0000);
  EXPECT_EQ(bits[4], 0x0002);
  EXPECT_EQ(bits[5], 0x7C00);
  be.cast(src, h, {1.0f, true, {}});
  EXPECT_EQ(bits[1], 0x7BFF);
  EXPECT_EQ(bits[2], 0xFBFF);
  EXPECT_EQ(bits[5], 0x7BFF);
  DeviceTensor back(be, DType::fp32, {7});
  be.cast(h, back);
  EXPECT_EQ(back.get()[6], -2.5f);
  EXPECT_EQ(back.get()[5], 65504.0f);
}

TEST(backend_cpu_cast, ScaleAndFusedAmaxOverTheUnscaledSource) {
  CpuBackend be(2);
  const auto values = random_values(5000, 11, -3.0f, 3.0f);
  DeviceTensor src(be, DType::fp32, {50, 100}, values);
  DeviceTensor dst(be, DType::bf16, {50, 100});
  DeviceTensor amax(be, DType::fp32, {1}, {0.5f});
  be.cast(src, dst, {4.0f, false, amax});
  double expected_amax = 0.0;
  for (float v : values) expected_amax = std::max(expected_amax, std::fabs(static_cast<double>(v)));
  EXPECT_EQ(amax.get()[0], static_cast<float>(expected_amax));
  const auto out = dst.get();
  for (std::size_t i = 0; i < values.size(); ++i)
    ASSERT_EQ(out[i], bf16_to_float(float_to_bf16(values[i] * 4.0f))) << i;
  // amax only grows.
  DeviceTensor small(be, DType::fp32, {2}, {0.1f, -0.2f});
  DeviceTensor small_dst(be, DType::fp16, {2});
  be.cast(small, small_dst, {1.0f, false, amax});
  EXPECT_EQ(amax.get()[0], static_cast<float>(expected_amax));
  // NaN in the source poisons amax so a policy can see it.
  DeviceTensor bad(be, DType::fp32, {2}, {1.0f, std::numeric_limits<float>::quiet_NaN()});
  be.cast(bad, small_dst, {1.0f, false, amax});
  EXPECT_TRUE(std::isnan(amax.get()[0]));
}

TEST(backend_cpu_cast, ToTf32AndBetweenHalfFormats) {
  CpuBackend be(1);
  DeviceTensor src(be, DType::fp32, {3}, {1.0f + 3 * 0x1p-11f, 0.1f, -7.0f});
  DeviceTensor t(be, DType::tf32, {3});
  be.cast(src, t);
  EXPECT_EQ(t.view().as<float>()[0], 1.0f + 0x1p-9f);
  EXPECT_EQ(t.view().as<float>()[1], round_to_tf32(0.1f));
  DeviceTensor h(be, DType::fp16, {3}, {1.0f + 0x1p-9f, 0.1f, -7.0f});
  DeviceTensor b(be, DType::bf16, {3});
  be.cast(h, b);
  EXPECT_EQ(b.get()[2], -7.0f);
  EXPECT_EQ(b.view().as<std::uint16_t>()[1], float_to_bf16(fp16_to_float(float_to_fp16(0.1f))));
}

TEST(backend_cpu_cast, MismatchedSizesAndNonFloatDtypesRaiseBackendError) {
  CpuBackend be(1);
  DeviceTensor src(be, DType::fp32, {4});
  DeviceTensor labels(be, DType::int32, {4});
  DeviceTensor wrong(be, DType::fp16, {5});
  EXPECT_THROW(be.cast(src, labels), sdk::BackendError);
  EXPECT_THROW(be.cast(labels, src), sdk::BackendError);
  EXPECT_THROW(be.cast(src, wrong), sdk::BackendError);
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
