// Scalar conversions against the written-out format definitions: every code decoded and
// re-encoded, a million-value sample against a nearest-value search, and hand-checked edge cases
// (ties, midpoints ± 1 ulp, overflow thresholds in both modes, subnormals, −0, inf, NaN).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "formats_test_util.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace {

using namespace formats_test;
using sdk::Overflow;

constexpr Overflow kSat = Overflow::saturate;
constexpr Overflow kInf = Overflow::to_inf_or_nan;
const float kInfF = std::numeric_limits<float>::infinity();

class ExhaustiveCodes : public ::testing::TestWithParam<Spec> {};

TEST_P(ExhaustiveCodes, DecodeMatchesDefinition) {
  const Spec& s = GetParam();
  const std::uint32_t n = 1u << (1 + s.e_bits + s.m_bits);
  int finite = 0, nans = 0, infs = 0;
  for (std::uint32_t c = 0; c < n; ++c) {
    const float got = sdk_decode(s, c);
    const bool negative = (c & sign_bit(s)) != 0;
    ASSERT_EQ(std::signbit(got), negative) << s.name << " code 0x" << std::hex << c;
    switch (kind_of(s, c)) {
      case Kind::finite:
        ++finite;
        ASSERT_EQ(static_cast<double>(got), value_of(s, c)) << s.name << " code 0x" << std::hex << c;
        break;
      case Kind::inf:
        ++infs;
        ASSERT_TRUE(std::isinf(got)) << s.name << " code 0x" << std::hex << c;
        break;
      case Kind::nan:
        ++nans;
        ASSERT_TRUE(std::isnan(got)) << s.name << " code 0x" << std::hex << c;
        ASSERT_NE(bits_of(got) & 0x00400000u, 0u) << "NaN must decode quiet: 0x" << std::hex << c;
        break;
    }
  }
  // Class counts pin down the special encodings of each format.
  const std::uint32_t m_codes = 1u << s.m_bits;
  if (s.has_inf) {
    EXPECT_EQ(infs, 2);
    EXPECT_EQ(nans, static_cast<int>(2 * (m_codes - 1)));
  } else {
    EXPECT_EQ(infs, 0);
    EXPECT_EQ(nans, 2);
  }
  EXPECT_EQ(finite + infs + nans, static_cast<int>(n));
}

TEST_P(ExhaustiveCodes, DecodeThenEncodeGivesSameBits) {
  const Spec& s = GetParam();
  const std::uint32_t n = 1u << (1 + s.e_bits + s.m_bits);
  for (std::uint32_t c = 0; c < n; ++c) {
    const float x = sdk_decode(s, c);
    const std::uint32_t a = sdk_encode(s, x, kInf), b = sdk_encode(s, x, kSat);
    switch (kind_of(s, c)) {
      case Kind::finite:
        ASSERT_EQ(a, c) << s.name << std::hex << " code 0x" << c;
        ASSERT_EQ(b, c) << s.name << std::hex << " code 0x" << c;
        break;
      case Kind::inf:
        ASSERT_EQ(a, c) << s.name << std::hex << " code 0x" << c;
        ASSERT_EQ(b, (c & sign_bit(s)) | s.max) << "saturate maps inf to max finite";
        break;
      case Kind::nan:
        ASSERT_TRUE(is_nan_code(s, a)) << s.name << std::hex << " code 0x" << c << " -> 0x" << a;
        ASSERT_TRUE(is_nan_code(s, b)) << s.name << std::hex << " code 0x" << c << " -> 0x" << b;
        ASSERT_EQ(a & sign_bit(s), c & sign_bit(s)) << "NaN keeps its sign";
        break;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(formats, ExhaustiveCodes, ::testing::Values(kFp16, kBf16, kE4M3, kE5M2),
                         [](const auto& info) { return std::string(info.param.name); });

class SampledEncode : public ::testing::TestWithParam<Spec> {};

TEST_P(SampledEncode, MatchesNearestValueSearchOnAMillionInputs) {
  const Spec& s = GetParam();
  const std::vector<float> xs = stress_sample(1'000'000, 0xF0F0 + s.e_bits * 31 + s.m_bits);
  for (Overflow ov : {kInf, kSat}) {
    std::size_t mismatches = 0;
    for (float x : xs) {
      const std::uint32_t got = sdk_encode(s, x, ov);
      if (std::isnan(x)) {
        if (!is_nan_code(s, got) || ((got & sign_bit(s)) != 0) != std::signbit(x)) ++mismatches;
        continue;
      }
      const std::uint32_t want = reference_encode(s, x, ov);
      if (got != want && ++mismatches <= 5)
        ADD_FAILURE() << s.name << (ov == kSat ? " saturate" : " to_inf_or_nan") << ": x="
                      << x << " (0x" << std::hex << bits_of(x) << ") got 0x" << got << " want 0x"
                      << want;
    }
    EXPECT_EQ(mismatches, 0u) << s.name;
  }
}

INSTANTIATE_TEST_SUITE_P(formats, SampledEncode,
                         ::testing::Values(kFp16, kBf16, kTf32, kE4M3, kE5M2),
                         [](const auto& info) { return std::string(info.param.name); });

float up(float x) { return std::nextafter(x, kInfF); }
float down(float x) { return std::nextafter(x, -kInfF); }

TEST(FormatsEdges, Fp16) {
  using sdk::encode_fp16;
  EXPECT_EQ(encode_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(encode_fp16(down(65520.0f)), 0x7BFF);
  EXPECT_EQ(encode_fp16(65520.0f), 0x7C00) << "midpoint above max ties to even -> inf";
  EXPECT_EQ(encode_fp16(65520.0f, kSat), 0x7BFF);
  EXPECT_EQ(encode_fp16(-65520.0f), 0xFC00);
  EXPECT_EQ(encode_fp16(-1e30f, kSat), 0xFBFF);
  EXPECT_EQ(encode_fp16(kInfF), 0x7C00);
  EXPECT_EQ(encode_fp16(kInfF, kSat), 0x7BFF);
  EXPECT_EQ(encode_fp16(-kInfF, kSat), 0xFBFF);
  EXPECT_EQ(encode_fp16(1.0f + 0x1p-11f), 0x3C00) << "tie -> even (down)";
  EXPECT_EQ(encode_fp16(up(1.0f + 0x1p-11f)), 0x3C01);
  EXPECT_EQ(encode_fp16(1.0f + 3 * 0x1p-11f), 0x3C02) << "tie -> even (up)";
  EXPECT_EQ(encode_fp16(down(1.0f + 3 * 0x1p-11f)), 0x3C01);
  EXPECT_EQ(encode_fp16(0x1p-14f), 0x0400) << "smallest normal";
  EXPECT_EQ(encode_fp16(0x1p-14f - 0x1p-25f), 0x0400) << "tie between 0x3FF and 0x400 -> even";
  EXPECT_EQ(encode_fp16(0x1p-24f), 0x0001) << "smallest subnormal";
  EXPECT_EQ(encode_fp16(0x1p-25f), 0x0000) << "tie between 0 and 2^-24 -> 0";
  EXPECT_EQ(encode_fp16(up(0x1p-25f)), 0x0001);
  EXPECT_EQ(encode_fp16(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(encode_fp16(-0x1p-26f), 0x8000) << "underflow keeps the sign";
  EXPECT_EQ(encode_fp16(from_bits(0x00000001)), 0x0000) << "fp32 subnormal";
  EXPECT_EQ(encode_fp16(from_bits(0x807FFFFF)), 0x8000);
  EXPECT_EQ(encode_fp16(-0.0f), 0x8000);
  EXPECT_EQ(encode_fp16(from_bits(0x7FC00000)), 0x7E00);
  EXPECT_EQ(encode_fp16(from_bits(0xFFC00000), kSat), 0xFE00) << "NaN survives saturation";
  EXPECT_EQ(encode_fp16(from_bits(0x7F800001)), 0x7E00) << "signalling NaN comes out quiet";
  EXPECT_EQ(encode_fp16(from_bits(0x7FA00000)), 0x7F00) << "top payload bits kept";
  EXPECT_EQ(sdk::decode_fp16(0x7BFF), 65504.0f);
  EXPECT_EQ(sdk::decode_fp16(0x0001), 0x1p-24f);
  EXPECT_EQ(bits_of(sdk::decode_fp16(0x7C01)), 0x7FC02000u) << "sNaN decodes quiet, payload kept";
}

TEST(FormatsEdges, Bf16) {
  using sdk::encode_bf16;
  EXPECT_EQ(encode_bf16(1.0f + 0x1p-8f), 0x3F80);
  EXPECT_EQ(encode_bf16(up(1.0f + 0x1p-8f)), 0x3F81);
  EXPECT_EQ(encode_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(encode_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(encode_bf16(std::numeric_limits<float>::max(), kSat), 0x7F7F);
  EXPECT_EQ(encode_bf16(from_bits(0x7F7F7FFF)), 0x7F7F);
  EXPECT_EQ(encode_bf16(from_bits(0x7F7F8000)), 0x7F80) << "overflow threshold (2-2^-8)*2^127";
  EXPECT_EQ(encode_bf16(from_bits(0xFF7F8000), kSat), 0xFF7F);
  EXPECT_EQ(encode_bf16(-kInfF), 0xFF80);
  EXPECT_EQ(encode_bf16(kInfF, kSat), 0x7F7F);
  // fp32 subnormals are bf16 subnormals: they must round, not flush.
  EXPECT_EQ(encode_bf16(from_bits(0x00008000)), 0x0000) << "tie -> even 0";
  EXPECT_EQ(encode_bf16(from_bits(0x00008001)), 0x0001);
  EXPECT_EQ(encode_bf16(from_bits(0x00018000)), 0x0002) << "tie -> even up";
  EXPECT_EQ(encode_bf16(from_bits(0x007FFFFF)), 0x0080) << "rounds up to the smallest normal";
  EXPECT_EQ(encode_bf16(from_bits(0x80000001)), 0x8000);
  EXPECT_EQ(encode_bf16(-0.0f), 0x8000);
  EXPECT_EQ(encode_bf16(from_bits(0x7F800001)), 0x7FC0);
  EXPECT_EQ(encode_bf16(from_bits(0xFFC12345), kSat), 0xFFC1);
  EXPECT_EQ(bits_of(sdk::decode_bf16(0x0001)), 0x00010000u);
  EXPECT_EQ(bits_of(sdk::decode_bf16(0x7F81)), 0x7FC10000u);
}

TEST(FormatsEdges, Tf32) {
  using sdk::round_to_tf32;
  EXPECT_EQ(round_to_tf32(1.0f + 0x1p-11f), 1.0f);
  EXPECT_EQ(round_to_tf32(up(1.0f + 0x1p-11f)), 1.0f + 0x1p-10f);
  EXPECT_EQ(round_to_tf32(1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);
  EXPECT_EQ(bits_of(round_to_tf32(from_bits(0x7F7FEFFF))), 0x7F7FE000u);
  EXPECT_EQ(round_to_tf32(from_bits(0x7F7FF000)), kInfF) << "overflow threshold (2-2^-11)*2^127";
  EXPECT_EQ(bits_of(round_to_tf32(std::numeric_limits<float>::max(), kSat)), 0x7F7FE000u);
  EXPECT_EQ(bits_of(round_to_tf32(-kInfF, kSat)), 0xFF7FE000u);
  EXPECT_EQ(round_to_tf32(-kInfF), -kInfF);
  EXPECT_EQ(bits_of(round_to_tf32(from_bits(0x00001000))), 0u) << "subnormal tie -> even";
  EXPECT_EQ(bits_of(round_to_tf32(from_bits(0x00003000))), 0x00004000u);
  EXPECT_EQ(bits_of(round_to_tf32(from_bits(0x807FF000))), 0x80800000u);
  EXPECT_EQ(bits_of(round_to_tf32(-0.0f)), 0x80000000u);
  EXPECT_EQ(bits_of(round_to_tf32(from_bits(0x7F800001))), 0x7FC00000u);
  EXPECT_EQ(bits_of(round_to_tf32(from_bits(0xFFA02001), kSat)), 0xFFE02000u);
}

TEST(FormatsEdges, Fp8E4M3) {
  auto enc = [](float x, Overflow ov = kInf) { return sdk::encode_fp8_e4m3(x, ov); };
  EXPECT_EQ(enc(448.0f), 0x7E);
  EXPECT_EQ(enc(464.0f), 0x7E) << "tie between 448 (even) and 480 (odd) stays at 448";
  EXPECT_EQ(enc(464.0f, kSat), 0x7E);
  EXPECT_EQ(enc(up(464.0f)), 0x7F) << "above 464 overflows: NaN, E4M3 has no inf";
  EXPECT_EQ(enc(up(464.0f), kSat), 0x7E);
  EXPECT_EQ(enc(-480.0f), 0xFF);
  EXPECT_EQ(enc(-480.0f, kSat), 0xFE);
  EXPECT_EQ(enc(kInfF), 0x7F);
  EXPECT_EQ(enc(kInfF, kSat), 0x7E) << "inf saturates to 448";
  EXPECT_EQ(enc(-kInfF, kSat), 0xFE);
  EXPECT_EQ(enc(from_bits(0x7FC00000), kSat), 0x7F);
  EXPECT_EQ(enc(from_bits(0xFF800001)), 0xFF);
  EXPECT_EQ(enc(1.0f), 0x38);
  EXPECT_EQ(enc(1.0625f), 0x38) << "tie 1 / 1.125 -> even";
  EXPECT_EQ(enc(up(1.0625f)), 0x39);
  EXPECT_EQ(enc(1.1875f), 0x3A) << "tie 1.125 / 1.25 -> even";
  EXPECT_EQ(enc(down(1.1875f)), 0x39);
  EXPECT_EQ(enc(0x1p-6f), 0x08) << "smallest normal";
  EXPECT_EQ(enc(7 * 0x1p-9f + 0x1p-10f), 0x08) << "tie 0x07 / 0x08 -> even";
  EXPECT_EQ(enc(0x1p-9f), 0x01) << "smallest subnormal";
  EXPECT_EQ(enc(0x1p-10f), 0x00) << "tie 0 / 2^-9 -> 0";
  EXPECT_EQ(enc(up(0x1p-10f)), 0x01);
  EXPECT_EQ(enc(-3 * 0x1p-10f), 0x82);
  EXPECT_EQ(enc(-0.0f), 0x80);
  EXPECT_EQ(enc(from_bits(0x00000001)), 0x00);
  // OCP 8-bit FP spec, E4M3 table.
  EXPECT_EQ(sdk::decode_fp8_e4m3(0x7E), 448.0f);
  EXPECT_EQ(sdk::decode_fp8_e4m3(0xFE), -448.0f);
  EXPECT_EQ(sdk::decode_fp8_e4m3(0x78), 256.0f);
  EXPECT_EQ(sdk::decode_fp8_e4m3(0x38), 1.0f);
  EXPECT_EQ(sdk::decode_fp8_e4m3(0x08), 0x1p-6f);
  EXPECT_EQ(sdk::decode_fp8_e4m3(0x07), 0.875f * 0x1p-6f);
  EXPECT_EQ(sdk::decode_fp8_e4m3(0x01), 0x1p-9f);
  EXPECT_TRUE(std::isnan(sdk::decode_fp8_e4m3(0x7F)));
  EXPECT_TRUE(std::isnan(sdk::decode_fp8_e4m3(0xFF)));
  EXPECT_EQ(sdk::decode_fp8_e4m3(0x80), 0.0f);
  EXPECT_TRUE(std::signbit(sdk::decode_fp8_e4m3(0x80)));
}

TEST(FormatsEdges, Fp8E5M2) {
  auto enc = [](float x, Overflow ov = kInf) { return sdk::encode_fp8_e5m2(x, ov); };
  EXPECT_EQ(enc(57344.0f), 0x7B);
  EXPECT_EQ(enc(down(61440.0f)), 0x7B);
  EXPECT_EQ(enc(61440.0f), 0x7C) << "tie 57344 (odd) / 65536 -> inf";
  EXPECT_EQ(enc(61440.0f, kSat), 0x7B);
  EXPECT_EQ(enc(-1e9f), 0xFC);
  EXPECT_EQ(enc(-1e9f, kSat), 0xFB);
  EXPECT_EQ(enc(kInfF), 0x7C);
  EXPECT_EQ(enc(kInfF, kSat), 0x7B);
  EXPECT_EQ(enc(from_bits(0x7FC00000)), 0x7E);
  EXPECT_EQ(enc(from_bits(0xFF800001), kSat), 0xFE);
  EXPECT_EQ(enc(from_bits(0x7FE00000)), 0x7F) << "top payload bit kept";
  EXPECT_EQ(enc(1.0f), 0x3C);
  EXPECT_EQ(enc(1.125f), 0x3C) << "tie 1 / 1.25 -> even";
  EXPECT_EQ(enc(1.375f), 0x3E) << "tie 1.25 / 1.5 -> even";
  EXPECT_EQ(enc(0x1p-14f), 0x04);
  EXPECT_EQ(enc(0x1p-16f), 0x01);
  EXPECT_EQ(enc(0x1p-17f), 0x00);
  EXPECT_EQ(enc(up(0x1p-17f)), 0x01);
  EXPECT_EQ(enc(3 * 0x1p-17f), 0x02);
  EXPECT_EQ(enc(-0.0f), 0x80);
  // OCP 8-bit FP spec, E5M2 table.
  EXPECT_EQ(sdk::decode_fp8_e5m2(0x7B), 57344.0f);
  EXPECT_EQ(sdk::decode_fp8_e5m2(0x7C), kInfF);
  EXPECT_EQ(sdk::decode_fp8_e5m2(0xFC), -kInfF);
  EXPECT_TRUE(std::isnan(sdk::decode_fp8_e5m2(0x7D)));
  EXPECT_TRUE(std::isnan(sdk::decode_fp8_e5m2(0x7E)));
  EXPECT_TRUE(std::isnan(sdk::decode_fp8_e5m2(0xFF)));
  EXPECT_EQ(sdk::decode_fp8_e5m2(0x3C), 1.0f);
  EXPECT_EQ(sdk::decode_fp8_e5m2(0x04), 0x1p-14f);
  EXPECT_EQ(sdk::decode_fp8_e5m2(0x03), 0.75f * 0x1p-14f);
  EXPECT_EQ(sdk::decode_fp8_e5m2(0x01), 0x1p-16f);
}

#if defined(__x86_64__)
// The contract says encodes are pure integer arithmetic: FTZ/DAZ set by some other library
// (oneDNN, a fast-math TU) must not flush bf16/tf32 subnormals or change a scale-free bulk call.
TEST(FormatsEdges, ScalarAndUnscaledBulkIgnoreFtzDaz) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // FTZ | DAZ
  const std::uint16_t bf = sdk::encode_bf16(from_bits(0x00018000));
  const float tf = sdk::round_to_tf32(from_bits(0x00003000));
  const float dec = sdk::decode_bf16(0x0001);
  const float dec16 = sdk::decode_fp16(0x0001);
  std::vector<float> src(64, from_bits(0x00018000));
  std::vector<std::uint16_t> dst(64);
  sdk::convert(src, dst, sdk::DType::bf16);
  _mm_setcsr(saved);
  EXPECT_EQ(bf, 0x0002);
  EXPECT_EQ(bits_of(tf), 0x00004000u);
  EXPECT_EQ(bits_of(dec), 0x00010000u);
  EXPECT_EQ(dec16, 0x1p-24f);
  for (std::uint16_t d : dst) ASSERT_EQ(d, 0x0002);
}
#endif

}  // namespace
