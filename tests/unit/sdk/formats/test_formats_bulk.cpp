// Bulk conversions: every ISA tier this CPU supports must produce the scalar reference's bits
// exactly (values, NaN payloads, signs), including loop tails, scale, amax and both overflow modes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <span>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "formats_test_util.h"

namespace {

using namespace formats_test;
using sdk::ConversionIsa;
using sdk::DType;
using sdk::Overflow;

const char* isa_name(ConversionIsa isa) {
  switch (isa) {
    case ConversionIsa::scalar: return "scalar";
    case ConversionIsa::avx2: return "avx2";
    case ConversionIsa::avx512: return "avx512";
    case ConversionIsa::avx512bf16: return "avx512bf16";
  }
  return "?";
}

// Restores the best tier even when an assertion returns early.
struct IsaGuard {
  ~IsaGuard() { sdk::limit_conversion_isa(ConversionIsa::avx512bf16); }
};

std::vector<ConversionIsa> tiers() {
  std::vector<ConversionIsa> out;
  for (ConversionIsa t : {ConversionIsa::scalar, ConversionIsa::avx2, ConversionIsa::avx512,
                          ConversionIsa::avx512bf16})
    if (static_cast<int>(t) <= static_cast<int>(sdk::supported_conversion_isa())) out.push_back(t);
  return out;
}

std::uint32_t max_abs_bits(const std::vector<float>& xs) {
  std::uint32_t m = 0;
  for (float x : xs) m = std::max(m, bits_of(x) & 0x7FFFFFFFu);
  return m;
}

// 1'000'013 values: not a multiple of any vector width, so every kernel runs its tail too.
const std::vector<float>& sample() {
  static const std::vector<float> xs = stress_sample(1'000'013, 0xB01C);
  return xs;
}

template <class Out>
void expect_encode_matches_scalar(DType to, Out (*scalar)(float, Overflow)) {
  IsaGuard guard;
  const std::vector<float>& xs = sample();
  const std::uint32_t want_amax = max_abs_bits(xs);
  ASSERT_TRUE(std::isnan(from_bits(want_amax))) << "the sample contains NaNs";
  for (ConversionIsa isa : tiers()) {
    ASSERT_EQ(sdk::limit_conversion_isa(isa), isa);
    for (Overflow ov : {Overflow::to_inf_or_nan, Overflow::saturate}) {
      for (float scale : {1.0f, 0.7f, 0x1p-12f}) {
        std::vector<Out> got(xs.size());
        float amax = -1.0f;
        sdk::convert(xs, std::span<Out>(got), to, {scale, ov, &amax});
        std::size_t bad = 0;
        for (std::size_t i = 0; i < xs.size(); ++i) {
          const Out want = scalar(scale == 1.0f ? xs[i] : xs[i] * scale, ov);
          if (got[i] != want && ++bad <= 5)
            ADD_FAILURE() << dtype_name(to) << " " << isa_name(isa) << " scale " << scale
                          << " x=0x" << std::hex << bits_of(xs[i]) << " got 0x" << +got[i]
                          << " want 0x" << +want;
        }
        EXPECT_EQ(bad, 0u) << dtype_name(to) << " " << isa_name(isa);
        EXPECT_EQ(bits_of(amax), want_amax) << isa_name(isa);
      }
    }
  }
}

std::uint16_t scalar_fp16(float x, Overflow ov) { return sdk::encode_fp16(x, ov); }
std::uint16_t scalar_bf16(float x, Overflow ov) { return sdk::encode_bf16(x, ov); }

TEST(FormatsBulk, Fp16EncodeEveryTierMatchesScalar) {
  expect_encode_matches_scalar<std::uint16_t>(DType::fp16, scalar_fp16);
}
TEST(FormatsBulk, Bf16EncodeEveryTierMatchesScalar) {
  expect_encode_matches_scalar<std::uint16_t>(DType::bf16, scalar_bf16);
}
TEST(FormatsBulk, Fp8E4M3EncodeEveryTierMatchesScalar) {
  expect_encode_matches_scalar<std::uint8_t>(DType::fp8_e4m3, sdk::encode_fp8_e4m3);
}
TEST(FormatsBulk, Fp8E5M2EncodeEveryTierMatchesScalar) {
  expect_encode_matches_scalar<std::uint8_t>(DType::fp8_e5m2, sdk::encode_fp8_e5m2);
}

// fp32 subnormal inputs are where AVX512-BF16's vcvtneps2bf16 differs (it flushes them): a block
// made only of them, surrounded by ordinary values, exercises the fix-up lanes.
TEST(FormatsBulk, Bf16SubnormalInputsRoundInEveryTier) {
  IsaGuard guard;
  std::vector<float> xs;
  for (std::uint32_t m = 0; m < (1u << 23); m += 0x101) {
    xs.push_back(from_bits(m));
    xs.push_back(from_bits(0x80000000u | (m ^ 0x7FFFFFu)));
  }
  for (ConversionIsa isa : tiers()) {
    sdk::limit_conversion_isa(isa);
    for (Overflow ov : {Overflow::to_inf_or_nan, Overflow::saturate}) {
      std::vector<std::uint16_t> got(xs.size());
      sdk::convert(xs, got, DType::bf16, {1.0f, ov, nullptr});
      for (std::size_t i = 0; i < xs.size(); ++i)
        ASSERT_EQ(got[i], sdk::encode_bf16(xs[i], ov))
            << isa_name(isa) << " x=0x" << std::hex << bits_of(xs[i]);
    }
  }
}

template <class In>
void expect_decode_matches_scalar(DType from, float (*scalar)(In)) {
  IsaGuard guard;
  // Every code, in a scrambled order, a few times over, plus an odd tail.
  const std::uint32_t codes = 1u << (8 * sizeof(In));
  std::vector<In> src;
  for (std::uint32_t r = 0; r < 7; ++r)
    for (std::uint32_t c = 0; c < codes; ++c) src.push_back(static_cast<In>((c * 40503u + r) % codes));
  src.resize(src.size() - 3);
  for (ConversionIsa isa : tiers()) {
    sdk::limit_conversion_isa(isa);
    for (float scale_inv : {1.0f, 3.5f, 0x1p-20f}) {
      std::vector<float> got(src.size());
      sdk::convert(std::span<const In>(src), from, got, scale_inv);
      for (std::size_t i = 0; i < src.size(); ++i) {
        const float v = scalar(src[i]);
        const float want = scale_inv == 1.0f ? v : v * scale_inv;
        ASSERT_EQ(bits_of(got[i]), bits_of(want))
            << dtype_name(from) << " " << isa_name(isa) << " code 0x" << std::hex << +src[i];
      }
    }
  }
}

TEST(FormatsBulk, Fp16DecodeEveryTierMatchesScalar) {
  expect_decode_matches_scalar<std::uint16_t>(DType::fp16, sdk::decode_fp16);
}
TEST(FormatsBulk, Bf16DecodeEveryTierMatchesScalar) {
  expect_decode_matches_scalar<std::uint16_t>(DType::bf16, sdk::decode_bf16);
}
TEST(FormatsBulk, Fp8E4M3DecodeEveryTierMatchesScalar) {
  expect_decode_matches_scalar<std::uint8_t>(DType::fp8_e4m3, sdk::decode_fp8_e4m3);
}
TEST(FormatsBulk, Fp8E5M2DecodeEveryTierMatchesScalar) {
  expect_decode_matches_scalar<std::uint8_t>(DType::fp8_e5m2, sdk::decode_fp8_e5m2);
}

TEST(FormatsBulk, Tf32InPlaceEveryTierMatchesScalar) {
  IsaGuard guard;
  for (ConversionIsa isa : tiers()) {
    sdk::limit_conversion_isa(isa);
    for (Overflow ov : {Overflow::to_inf_or_nan, Overflow::saturate}) {
      std::vector<float> data = sample();
      sdk::round_to_tf32(data, ov);
      for (std::size_t i = 0; i < data.size(); ++i)
        ASSERT_EQ(bits_of(data[i]), bits_of(sdk::round_to_tf32(sample()[i], ov)))
            << isa_name(isa) << " x=0x" << std::hex << bits_of(sample()[i]);
    }
  }
}

TEST(FormatsBulk, AbsMaxIsNanAwareInEveryTier) {
  IsaGuard guard;
  for (ConversionIsa isa : tiers()) {
    sdk::limit_conversion_isa(isa);
    for (std::size_t n : {0u, 1u, 7u, 8u, 31u, 33u, 1000u}) {
      std::vector<float> xs(n);
      for (std::size_t i = 0; i < n; ++i) xs[i] = std::ldexp(static_cast<float>(i % 13) - 6.0f, -static_cast<int>(i % 5));
      const float plain = n == 0 ? 0.0f : 6.0f;
      EXPECT_EQ(sdk::abs_max(xs), plain) << isa_name(isa) << " n=" << n;
      if (n == 0) continue;
      for (std::size_t where : {std::size_t{0}, n / 2, n - 1}) {
        std::vector<float> ys = xs;
        ys[where] = -std::numeric_limits<float>::infinity();
        EXPECT_EQ(sdk::abs_max(ys), std::numeric_limits<float>::infinity()) << isa_name(isa);
        ys[where] = -std::numeric_limits<float>::quiet_NaN();
        EXPECT_TRUE(std::isnan(sdk::abs_max(ys))) << isa_name(isa) << " n=" << n << " at " << where;
        float amax = 0.0f;
        std::vector<std::uint8_t> out(n);
        sdk::convert(ys, out, DType::fp8_e4m3, {1.0f, Overflow::saturate, &amax});
        EXPECT_TRUE(std::isnan(amax)) << isa_name(isa) << " n=" << n << " at " << where;
      }
    }
  }
}

TEST(FormatsBulk, ScaleAppliesBeforeRoundingAndAmaxIsUnscaled) {
  const std::vector<float> xs = {1000.0f, -3.0f, 0.001f, 70000.0f, -0.0f, 1e-3f * 0x1p-10f};
  std::vector<std::uint8_t> e4m3(xs.size());
  float amax = 0.0f;
  sdk::convert(xs, e4m3, DType::fp8_e4m3, {0.25f, Overflow::saturate, &amax});
  EXPECT_EQ(amax, 70000.0f);
  EXPECT_EQ(e4m3[0], 0x78) << "1000 * 0.25 = 250 -> 256";
  EXPECT_EQ(e4m3[1], 0xB4) << "-0.75";
  EXPECT_EQ(e4m3[3], 0x7E) << "17500 saturates to 448";
  EXPECT_EQ(e4m3[4], 0x80);
  std::vector<std::uint16_t> h(xs.size());
  sdk::convert(xs, h, DType::fp16, {0x1p-2f, Overflow::to_inf_or_nan, nullptr});
  EXPECT_EQ(h[3], sdk::encode_fp16(17500.0f));
  sdk::convert(xs, h, DType::fp16, {});
  EXPECT_EQ(h[3], 0x7C00) << "unscaled 70000 overflows to inf";
  std::vector<float> back(xs.size());
  sdk::convert(std::span<const std::uint8_t>(e4m3), DType::fp8_e4m3, back, 4.0f);
  EXPECT_EQ(back[0], 1024.0f);
  EXPECT_EQ(back[1], -3.0f);
  EXPECT_EQ(back[3], 1792.0f);
  float empty_amax = -1.0f;
  std::vector<float> none;
  std::vector<std::uint16_t> none16;
  sdk::convert(none, none16, DType::bf16, {1.0f, Overflow::saturate, &empty_amax});
  EXPECT_EQ(empty_amax, 0.0f);
}

TEST(FormatsBulk, RejectsMismatchedSizesAndDTypes) {
  std::vector<float> xs(4, 1.0f);
  std::vector<std::uint16_t> h3(3), h4(4, 0xABCD);
  std::vector<std::uint8_t> b4(4);
  EXPECT_THROW(sdk::convert(xs, h3, DType::fp16), std::invalid_argument);
  EXPECT_THROW(sdk::convert(xs, h4, DType::fp8_e4m3), std::invalid_argument);
  EXPECT_THROW(sdk::convert(xs, b4, DType::bf16, {}), std::invalid_argument);
  EXPECT_THROW(sdk::convert(std::span<const std::uint16_t>(h4), DType::fp32, xs), std::invalid_argument);
  EXPECT_THROW(sdk::convert(std::span<const std::uint8_t>(b4), DType::fp16, xs), std::invalid_argument);
  for (std::uint16_t v : h4) EXPECT_EQ(v, 0xABCD) << "nothing written on error";
}

TEST(FormatsBulk, ReportsTheTierInUse) {
  IsaGuard guard;
  const ConversionIsa best = sdk::supported_conversion_isa();
  EXPECT_EQ(sdk::active_conversion_isa(), best);
  EXPECT_EQ(sdk::limit_conversion_isa(ConversionIsa::scalar), ConversionIsa::scalar);
  EXPECT_EQ(std::string(sdk::conversion_paths()).rfind("scalar", 0), 0u);
  EXPECT_EQ(sdk::limit_conversion_isa(ConversionIsa::avx512bf16), best);
  std::cout << "conversion tier " << isa_name(best) << ": " << sdk::conversion_paths() << "\n";
}

}  // namespace
