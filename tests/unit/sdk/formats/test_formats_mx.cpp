// fp4 E2M1 and E8M0 (the OCP MX element and scale formats) and the rules block-scaled encodings
// build on (float_format_rules.h: encodes of x·2^k, stochastic rounding, the power-of-two block
// scales), against definitions written out here and against ml_dtypes: its answers for every code
// and a list of boundary inputs are committed (mx_reference_table.inc, gen_mx_reference.py), and
// where the peers venv imports ml_dtypes it converts a 100k-value sweep live.
//
// Why the sweep is exhaustive in effect: for a given sign and fp32 exponent, both encodes are
// monotone in the mantissa with at most one threshold per output code, so every exponent at the
// mantissas either side of each threshold (every E2M1 midpoint ± 1 ulp, E8M0's 0x3FFFFF / 0x400000)
// plus random mantissas between them covers every fp32 the rules can treat differently.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "formats_test_util.h"
#include "mixtrain/sdk/support/float_format_rules.h"
#include "python_peers.h"

namespace {

#include "mx_reference_table.inc"

using namespace formats_test;
namespace fr = mixtrain::sdk::format_rules;
namespace fs = std::filesystem;

const float kInfF = std::numeric_limits<float>::infinity();

const std::vector<double>& kE2M1 = e2m1_values();

// What encode_fp4_e2m1 must give: the nearest value, a tie to the even code, saturating at 6, the
// sign kept (-0 too); a NaN gives the zero of the opposite sign (ml_dtypes' choice).
std::uint8_t e2m1_definition(float x) {
  if (std::isnan(x)) return std::signbit(x) ? 0x0 : 0x8;
  const std::uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 6.0) return sign | 0x7;
  int i = 0;
  while (kE2M1[i + 1] <= a) ++i;
  const double dlo = a - kE2M1[i], dhi = kE2M1[i + 1] - a;
  const int code = (dhi < dlo || (dhi == dlo && i % 2 == 1)) ? i + 1 : i;
  return static_cast<std::uint8_t>(sign | code);
}

// What encode_e8m0 must give, as ml_dtypes' float8_e8m0fnu: NaN for what E8M0 lacks (NaN, inf,
// zero, negatives) and for 2^128 and above; a normal x in [2^e, 2^(e+1)) rounds to 2^e below
// 1.5·2^e, to 2^(e+1) from there on; an fp32 subnormal to 2^-127 up to 2^-127, else to 2^-126.
std::uint8_t e8m0_definition(float x) {
  if (!(x > 0.0f) || std::isinf(x)) return 0xFF;
  if (x < 0x1p-126f) return x > 0x1p-127f ? 1 : 0;
  const int e = std::ilogb(x);
  const int k = static_cast<double>(x) >= 1.5 * std::ldexp(1.0, e) ? e + 1 : e;
  return k > 127 ? 0xFF : static_cast<std::uint8_t>(k + 127);
}

// fp32 patterns for the sweep: every sign and exponent with the threshold mantissas of both
// formats and random ones, every E2M1 midpoint ± 1 ulp, and the stress sample of the other
// formats' tests (NaN payloads, infinities, subnormals).
std::vector<float> sweep() {
  std::vector<float> xs = stress_sample(40'000, 0x4D58);
  std::mt19937 rng(38);
  std::uniform_int_distribution<std::uint32_t> mantissa(0, 0x7FFFFF);
  for (std::uint32_t s = 0; s < 2; ++s)
    for (std::uint32_t e = 0; e < 256; ++e) {
      for (std::uint32_t m :
           {0x0u, 0x1u, 0x200000u, 0x3FFFFFu, 0x400000u, 0x400001u, 0x600000u, 0x7FFFFFu})
        xs.push_back(from_bits(s << 31 | e << 23 | m));
      for (int i = 0; i < 64; ++i) xs.push_back(from_bits(s << 31 | e << 23 | mantissa(rng)));
    }
  for (int i = 0; i + 1 < 8; ++i) {
    const float mid = static_cast<float>((kE2M1[i] + kE2M1[i + 1]) / 2);
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInfF), -mid})
      xs.push_back(v);
  }
  for (float v : {6.0f, 6.5f, 7.0f, 8.0f, std::nextafter(6.0f, kInfF), 1e30f})
    xs.push_back(v), xs.push_back(-v);
  return xs;
}

TEST(FormatsMx, E2M1DecodesEveryCodeAndIgnoresTheHighNibble) {
  for (std::uint32_t byte = 0; byte < 256; ++byte) {
    const std::uint32_t c = byte & 0xF;
    const float got = sdk::decode_fp4_e2m1(static_cast<std::uint8_t>(byte));
    const double want = (c & 0x8 ? -1.0 : 1.0) * kE2M1[c & 0x7];
    ASSERT_EQ(static_cast<double>(got), want) << "byte 0x" << std::hex << byte;
    ASSERT_EQ(std::signbit(got), (c & 0x8) != 0) << "byte 0x" << std::hex << byte;
    ASSERT_EQ(bits_of(got), bits_of(fr::decode<fr::E2M1>(byte)));
  }
}

TEST(FormatsMx, E8M0DecodesEveryCode) {
  for (std::uint32_t c = 0; c < 255; ++c)
    ASSERT_EQ(static_cast<double>(sdk::decode_e8m0(static_cast<std::uint8_t>(c))),
              std::ldexp(1.0, static_cast<int>(c) - 127))
        << "code " << c;
  EXPECT_EQ(bits_of(sdk::decode_e8m0(0)), 0x00400000u) << "2^-127 is an fp32 subnormal";
  EXPECT_EQ(bits_of(sdk::decode_e8m0(0xFF)), 0x7FC00000u) << "0xFF is E8M0's NaN, decoded quiet";
}

TEST(FormatsMx, EveryCodeEncodesBackToItself) {
  for (std::uint32_t c = 0; c < 16; ++c)
    ASSERT_EQ(sdk::encode_fp4_e2m1(sdk::decode_fp4_e2m1(static_cast<std::uint8_t>(c))), c) << c;
  for (std::uint32_t c = 0; c < 256; ++c)
    ASSERT_EQ(sdk::encode_e8m0(sdk::decode_e8m0(static_cast<std::uint8_t>(c))), c) << c;
}

TEST(FormatsMx, EncodesMatchTheDefinitionsOnTheSweep) {
  const std::vector<float> xs = sweep();
  std::size_t bad_e2m1 = 0, bad_e8m0 = 0;
  for (float x : xs) {
    const std::uint8_t e2 = sdk::encode_fp4_e2m1(x), e8 = sdk::encode_e8m0(x);
    if (e2 != e2m1_definition(x) && ++bad_e2m1 <= 5)
      ADD_FAILURE() << "e2m1 x=0x" << std::hex << bits_of(x) << " got 0x" << int{e2} << " want 0x"
                    << int{e2m1_definition(x)};
    if (e8 != e8m0_definition(x) && ++bad_e8m0 <= 5)
      ADD_FAILURE() << "e8m0 x=0x" << std::hex << bits_of(x) << " got 0x" << int{e8} << " want 0x"
                    << int{e8m0_definition(x)};
  }
  EXPECT_EQ(bad_e2m1, 0u);
  EXPECT_EQ(bad_e8m0, 0u);
}

TEST(FormatsMx, HandCheckedEdges) {
  auto e8 = [](float x) { return sdk::encode_e8m0(x); };
  EXPECT_EQ(e8(1.0f), 0x7F);
  EXPECT_EQ(e8(3.0f), 0x81) << "3 is 1.5·2: a tie, rounded up to 4";
  EXPECT_EQ(e8(std::nextafter(3.0f, 0.0f)), 0x80);
  EXPECT_EQ(e8(1.5f), 0x80);
  EXPECT_EQ(e8(0.75f), 0x7F);
  EXPECT_EQ(e8(0.3f), 0x7D) << "0.25";
  EXPECT_EQ(e8(0x1p127f), 0xFE);
  EXPECT_EQ(e8(from_bits(0x7F3FFFFF)), 0xFE);
  EXPECT_EQ(e8(from_bits(0x7F400000)), 0xFF) << "1.5·2^127 rounds to 2^128: NaN, no saturation";
  EXPECT_EQ(e8(std::numeric_limits<float>::max()), 0xFF);
  EXPECT_EQ(e8(0x1p-127f), 0x00);
  EXPECT_EQ(e8(0x1p-149f), 0x00) << "below 2^-127: the smallest code, E8M0 has no zero";
  EXPECT_EQ(e8(std::nextafter(0x1p-127f, 1.0f)), 0x01) << "ml_dtypes' subnormal rule";
  EXPECT_EQ(e8(0.0f), 0xFF);
  EXPECT_EQ(e8(-0.0f), 0xFF);
  EXPECT_EQ(e8(-1.0f), 0xFF);
  EXPECT_EQ(e8(kInfF), 0xFF);
  EXPECT_EQ(e8(std::numeric_limits<float>::quiet_NaN()), 0xFF);

  auto e2 = [](float x) { return sdk::encode_fp4_e2m1(x); };
  EXPECT_EQ(e2(0.25f), 0x0) << "tie 0 / 0.5 -> even";
  EXPECT_EQ(e2(std::nextafter(0.25f, 1.0f)), 0x1);
  EXPECT_EQ(e2(0.75f), 0x2) << "tie 0.5 / 1 -> even (1)";
  EXPECT_EQ(e2(1.25f), 0x2) << "tie 1 / 1.5 -> even (1)";
  EXPECT_EQ(e2(1.75f), 0x4) << "tie 1.5 / 2 -> even (2)";
  EXPECT_EQ(e2(2.5f), 0x4) << "tie 2 / 3 -> even (2)";
  EXPECT_EQ(e2(3.5f), 0x6) << "tie 3 / 4 -> even (4)";
  EXPECT_EQ(e2(5.0f), 0x6) << "tie 4 / 6 -> even (4)";
  EXPECT_EQ(e2(std::nextafter(5.0f, 6.0f)), 0x7);
  EXPECT_EQ(e2(7.0f), 0x7) << "saturates";
  EXPECT_EQ(e2(1e30f), 0x7);
  EXPECT_EQ(e2(kInfF), 0x7);
  EXPECT_EQ(e2(-kInfF), 0xF);
  EXPECT_EQ(e2(-0.0f), 0x8);
  EXPECT_EQ(e2(-0.1f), 0x8) << "underflow keeps the sign";
  EXPECT_EQ(e2(from_bits(0x7FC00000)), 0x8) << "+NaN -> -0, as ml_dtypes";
  EXPECT_EQ(e2(from_bits(0xFFC00000)), 0x0) << "-NaN -> +0, as ml_dtypes";
  EXPECT_EQ(fr::encode<fr::E2M1>(7.0f, false), 0x7u) << "no inf to overflow to";
}

TEST(FormatsMx, CommittedMlDtypesTableAgreesBitForBit) {
  EXPECT_STREQ(kMlDtypesVersion, "0.5.1");
  for (std::uint32_t c = 0; c < 16; ++c)
    ASSERT_EQ(bits_of(sdk::decode_fp4_e2m1(static_cast<std::uint8_t>(c))), kMlDtypesE2M1Values[c])
        << "e2m1 code " << c;
  for (std::uint32_t c = 0; c < 256; ++c)
    ASSERT_EQ(bits_of(sdk::decode_e8m0(static_cast<std::uint8_t>(c))), kMlDtypesE8M0Values[c])
        << "e8m0 code " << c;
  std::size_t bad = 0;
  for (std::uint64_t entry : kMlDtypesEncodeCases) {
    const float x = from_bits(static_cast<std::uint32_t>(entry >> 16));
    const auto e2m1 = static_cast<std::uint8_t>((entry >> 8) & 0xFF);
    const auto e8m0 = static_cast<std::uint8_t>(entry & 0xFF);
    if ((sdk::encode_fp4_e2m1(x) != e2m1 || sdk::encode_e8m0(x) != e8m0) && ++bad <= 5)
      ADD_FAILURE() << "x=0x" << std::hex << bits_of(x) << " ml_dtypes e2m1 0x" << int{e2m1}
                    << " e8m0 0x" << int{e8m0} << ", ours 0x" << int{sdk::encode_fp4_e2m1(x)}
                    << " 0x" << int{sdk::encode_e8m0(x)};
  }
  EXPECT_EQ(bad, 0u) << "of " << std::size(kMlDtypesEncodeCases) << " cases";
  EXPECT_GT(std::size(kMlDtypesEncodeCases), 600u);
}

struct TempDir {
  fs::path path =
      fs::temp_directory_path() / ("mixtrain_formats_mx_" + std::to_string(::getpid()) + "_" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  TempDir() { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

TEST(FormatsMx, LiveMlDtypesAgreesBitForBit) {
  using mixtrain::test::peers_import;
  if (!peers_import("ml_dtypes"))
    GTEST_SKIP() << mixtrain::test::peers_missing_message(
        "ml_dtypes", "the committed table (CommittedMlDtypesTableAgreesBitForBit) still checks");
  TempDir tmp;
  const std::vector<float> xs = sweep();
  {
    std::ofstream out(tmp.path / "x.f32", std::ios::binary);
    out.write(reinterpret_cast<const char*>(xs.data()),
              static_cast<std::streamsize>(xs.size() * sizeof(float)));
  }
  std::ofstream(tmp.path / "convert.py") << R"(import sys, numpy as np, ml_dtypes
d = sys.argv[1]
x = np.fromfile(d + '/x.f32', dtype=np.float32)
with np.errstate(all='ignore'):
    x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8).tofile(d + '/e2m1.u8')
    x.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8).tofile(d + '/e8m0.u8')
)";
  const std::string cmd = mixtrain::test::peers_python() + " " +
                          (tmp.path / "convert.py").string() + " " + tmp.path.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto read = [&](const char* name) {
    std::vector<std::uint8_t> v(xs.size());
    std::ifstream in(tmp.path / name, std::ios::binary);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size()));
    EXPECT_EQ(static_cast<std::size_t>(in.gcount()), v.size()) << name;
    return v;
  };
  const auto e2m1 = read("e2m1.u8"), e8m0 = read("e8m0.u8");
  std::size_t bad_e2m1 = 0, bad_e8m0 = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (sdk::encode_fp4_e2m1(xs[i]) != e2m1[i] && ++bad_e2m1 <= 5)
      ADD_FAILURE() << "e2m1 x=0x" << std::hex << bits_of(xs[i]) << " ml_dtypes 0x" << int{e2m1[i]};
    if (sdk::encode_e8m0(xs[i]) != e8m0[i] && ++bad_e8m0 <= 5)
      ADD_FAILURE() << "e8m0 x=0x" << std::hex << bits_of(xs[i]) << " ml_dtypes 0x" << int{e8m0[i]};
  }
  EXPECT_EQ(bad_e2m1, 0u) << "of " << xs.size();
  EXPECT_EQ(bad_e8m0, 0u) << "of " << xs.size();
}

// ---- encode_scaled: x·2^k rounded once -------------------------------------------------------

struct ScaledCase {
  const char* name;
  std::vector<double> values;  // positive finite values by code
  std::uint32_t sign, max, overflow_inf;
  std::uint32_t (*encode)(float, int, bool);
  std::uint32_t (*encode_sr)(float, int, bool, std::uint32_t);
};

std::vector<ScaledCase> scaled_cases() {
  return {
      {"e4m3", positive_values(kE4M3), 0x80, 0x7E, 0x7F, &fr::encode_scaled<fr::E4M3>,
       &fr::encode_scaled_stochastic<fr::E4M3>},
      {"e5m2", positive_values(kE5M2), 0x80, 0x7B, 0x7C, &fr::encode_scaled<fr::E5M2>,
       &fr::encode_scaled_stochastic<fr::E5M2>},
      {"e2m1", e2m1_values(), 0x8, 0x7, 0x7, &fr::encode_scaled<fr::E2M1>,
       &fr::encode_scaled_stochastic<fr::E2M1>},
  };
}

TEST(FormatsMx, EncodeScaledRoundsTheExactProductOnce) {
  std::mt19937 rng(0x5CA1E);
  std::uniform_int_distribution<int> kdist(-160, 160);
  const std::vector<float> xs = stress_sample(60'000, 0x5CA1E);
  for (const ScaledCase& f : scaled_cases()) {
    std::size_t bad = 0, checked = 0;
    for (float x : xs) {
      if (!std::isfinite(x)) continue;
      const int k = kdist(rng);
      const double a = std::ldexp(std::fabs(static_cast<double>(x)), k);  // exact
      const std::uint32_t sign = std::signbit(x) ? f.sign : 0;
      for (bool saturate : {true, false}) {
        const std::uint32_t want =
            sign | nearest_code(f.values, a, saturate ? f.max : f.overflow_inf);
        const std::uint32_t got = f.encode(x, k, saturate);
        ++checked;
        if (got != want && ++bad <= 5)
          ADD_FAILURE() << f.name << " x=0x" << std::hex << bits_of(x) << std::dec << " k=" << k
                        << (saturate ? " saturating" : "") << ": got 0x" << std::hex << got
                        << " want 0x" << want;
      }
    }
    EXPECT_EQ(bad, 0u) << f.name << " of " << checked;
  }
}

TEST(FormatsMx, EncodeScaledByOneIsEncode) {
  const std::vector<float> xs = sweep();
  for (float x : xs)
    for (bool sat : {true, false}) {
      ASSERT_EQ(fr::encode_scaled<fr::Fp16>(x, 0, sat), fr::encode<fr::Fp16>(x, sat)) << x;
      ASSERT_EQ(fr::encode_scaled<fr::Bf16>(x, 0, sat), fr::encode<fr::Bf16>(x, sat)) << x;
      ASSERT_EQ(fr::encode_scaled<fr::Tf32>(x, 0, sat), fr::encode<fr::Tf32>(x, sat)) << x;
      ASSERT_EQ(fr::encode_scaled<fr::E4M3>(x, 0, sat), fr::encode<fr::E4M3>(x, sat)) << x;
      ASSERT_EQ(fr::encode_scaled<fr::E5M2>(x, 0, sat), fr::encode<fr::E5M2>(x, sat)) << x;
      ASSERT_EQ(fr::encode_scaled<fr::E2M1>(x, 0, sat), fr::encode<fr::E2M1>(x, sat)) << x;
    }
}

TEST(FormatsMx, EncodeScaledEdges) {
  // A subnormal fp32 scaled into E4M3's normal range keeps all its bits.
  EXPECT_EQ(fr::encode_scaled<fr::E4M3>(0x1.8p-130f, 130, true), 0x3Cu) << "1.5";
  EXPECT_EQ(fr::encode_scaled<fr::E2M1>(0x1p-140f, 142, true), 0x6u) << "4";
  // A product far outside fp32's range.
  EXPECT_EQ(fr::encode_scaled<fr::E4M3>(1.0f, 200, true), 0x7Eu);
  EXPECT_EQ(fr::encode_scaled<fr::E4M3>(-1.0f, 200, false), 0xFFu) << "E4M3 overflow is NaN";
  EXPECT_EQ(fr::encode_scaled<fr::E5M2>(1.0f, 200, false), 0x7Cu) << "inf";
  const float fmax = std::numeric_limits<float>::max();  // (2 - 2^-23)·2^127
  EXPECT_EQ(fr::encode_scaled<fr::E4M3>(fmax, -120, true), 0x78u) << "just under 2^8 -> 256";
  EXPECT_EQ(fr::encode_scaled<fr::E4M3>(fmax, -119, true), 0x7Eu) << "just under 512: saturates";
  EXPECT_EQ(fr::encode_scaled<fr::E4M3>(1.0f, -10, true), 0x00u) << "2^-10: tie 0 / 2^-9 -> 0";
  EXPECT_EQ(fr::encode_scaled<fr::E4M3>(1.5f, -10, true), 0x01u);
  EXPECT_EQ(fr::encode_scaled<fr::E4M3>(-0.0f, 50, true), 0x80u);
  EXPECT_EQ(fr::encode_scaled<fr::E4M3>(kInfF, -300, true), 0x7Eu) << "inf saturates";
  EXPECT_EQ(fr::encode_scaled<fr::E4M3>(from_bits(0xFFC00000), 3, true), 0xFFu);
}

// ---- stochastic rounding ---------------------------------------------------------------------

TEST(FormatsMx, StochasticShiftRoundsUpForExactlyRemOver2ToTheSRandomValues) {
  // Up iff rbits < rem·2^(32-s): check the threshold itself for several shifts and remainders.
  for (unsigned s : {1u, 2u, 7u, 22u, 23u, 28u, 31u}) {
    const std::uint32_t q = s > 28 ? 1u : 5u, base = q << s;
    for (std::uint32_t rem : {1u, (1u << s) / 2, (1u << s) - 1}) {
      if (rem == 0) continue;
      const std::uint32_t threshold = rem << (32 - s);
      EXPECT_EQ(fr::stochastic_shift(base + rem, s, threshold - 1), q + 1) << s << " " << rem;
      EXPECT_EQ(fr::stochastic_shift(base + rem, s, threshold), q) << s << " " << rem;
      EXPECT_EQ(fr::stochastic_shift(base + rem, s, 0), q + 1);
      EXPECT_EQ(fr::stochastic_shift(base + rem, s, 0xFFFFFFFFu), q);
    }
    EXPECT_EQ(fr::stochastic_shift(base, s, 0), q) << "on the grid: never moves";
  }
  EXPECT_EQ(fr::stochastic_shift(0x800000u, 32, 0x7FFFFFu), 1u) << "s = 32: P = v / 2^32";
  EXPECT_EQ(fr::stochastic_shift(0x800000u, 32, 0x800000u), 0u);
  EXPECT_EQ(fr::stochastic_shift(0x800000u, 40, 0x7FFFu), 1u) << "s > 32: P = (v >> (s-32)) / 2^32";
  EXPECT_EQ(fr::stochastic_shift(0x800000u, 40, 0x8000u), 0u);
  EXPECT_EQ(fr::stochastic_shift(0xFFFFFFu, 63, 0u), 0u) << "beyond 2^-32: never";
}

TEST(FormatsMx, RandomBitsAreSplitMix64) {
  // SplitMix64 seeded with 0: 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F.
  EXPECT_EQ(fr::random_bits(0, 0), 0xE220A839u);
  EXPECT_EQ(fr::random_bits(0, 1), 0x6E789E6Au);
  EXPECT_EQ(fr::random_bits(0, 2), 0x06C45D18u);
  EXPECT_NE(fr::random_bits(1, 0), fr::random_bits(0, 0));
}

TEST(FormatsMx, StochasticEncodePicksANeighbourWithTheRightFrequency) {
  const std::vector<float> xs = stress_sample(4'000, 0x5EED);
  for (const ScaledCase& f : scaled_cases()) {
    for (float x : xs) {
      if (!std::isfinite(x)) continue;
      const int k = static_cast<int>(bits_of(x) % 41) - 20;
      const double a = std::ldexp(std::fabs(static_cast<double>(x)), k);
      const std::uint32_t sign = std::signbit(x) ? f.sign : 0;
      // The two codes around a (a code above max saturates to max).
      std::size_t lo = 0;
      while (lo + 1 < f.values.size() && f.values[lo + 1] <= a) ++lo;
      const std::size_t hi = f.values[lo] == a ? lo : lo + 1;
      for (std::uint64_t i = 0; i < 8; ++i) {
        const std::uint32_t got = f.encode_sr(x, k, true, fr::random_bits(7, i)) & ~f.sign;
        const std::uint32_t hi_code = static_cast<std::uint32_t>(std::min(hi, f.values.size() - 1));
        ASSERT_TRUE(got == lo || got == hi_code)
            << f.name << " x=" << x << " k=" << k << " got " << got << " around " << lo;
        ASSERT_EQ(f.encode_sr(x, k, true, fr::random_bits(7, i)) & f.sign, sign);
      }
    }
  }
  // Frequencies: in E2M1, 1.25 lies halfway from 1 to 1.5, 1.125 a quarter of the way, 5.5 three
  // quarters of the way from 4 to 6; over 2^16 counter-based draws the share rounded up is within
  // 0.01 (5 standard deviations) of that, and deterministic: the bits are a function of the index.
  for (auto [x, p, lower] : {std::tuple{1.25f, 0.5, 0x2u}, std::tuple{1.125f, 0.25, 0x2u},
                             std::tuple{5.5f, 0.75, 0x6u}}) {
    int up = 0;
    const int n = 1 << 16;
    for (int i = 0; i < n; ++i)
      up += fr::encode_scaled_stochastic<fr::E2M1>(x, 0, true, fr::random_bits(99, i)) > lower;
    EXPECT_NEAR(static_cast<double>(up) / n, p, 0.01) << x;
  }
}

// ---- power-of-two block scales ---------------------------------------------------------------

template <class F>
double max_of() {
  return static_cast<double>(fr::decode<F>(F::kMax));
}

// Transformer Engine's MXFP8 scale: amax·(1/max) in fp32, then its E8M0 rounded up (its CUDA
// helper's emulation path): the exponent of the product, plus one when any mantissa bit is set.
int te_round_up(float amax, float max) {
  const float v = amax * (1.0f / max);
  if (v == 0.0f) return -127;
  const std::uint32_t b = bits_of(v), e = b >> 23, m = b & 0x7FFFFF;
  const bool up = m > 0 && e != 0xFE && !(e == 0 && m <= 0x400000);
  return static_cast<int>(e + (up ? 1 : 0)) - 127;
}

template <class F>
void check_mx_rules(const char* name) {
  const double max = max_of<F>();
  const int emax = fr::emax_elem<F>();
  std::vector<float> amaxes = {0.0f, std::numeric_limits<float>::max(), 0x1p-149f, 0x1p-127f};
  std::mt19937 rng(0xE8);
  std::uniform_int_distribution<std::uint32_t> mantissa(0, 0x7FFFFF);
  for (std::uint32_t e = 0; e < 255; ++e) {
    for (std::uint32_t m : {0x0u, 0x1u, 0x7FFFFFu, mantissa(rng), mantissa(rng)})
      amaxes.push_back(from_bits(e << 23 | m));
    // max·2^j and its neighbours: where round-up steps.
    const float edge = static_cast<float>(std::ldexp(max, static_cast<int>(e) - 127));
    if (std::isfinite(edge) && edge > 0)
      for (float v : {edge, std::nextafter(edge, 0.0f), std::nextafter(edge, kInfF)})
        amaxes.push_back(v);
  }
  std::size_t te_checked = 0;
  for (float a : amaxes) {
    if (!std::isfinite(a)) continue;
    const std::uint32_t bits = bits_of(a);
    ASSERT_EQ(fr::mx_scale_exponent_floor<F>(bits), mx_floor_definition(a, emax))
        << name << " amax=" << a;
    ASSERT_EQ(fr::mx_scale_exponent_round_up<F>(bits), mx_round_up_definition(a, max))
        << name << " amax=" << a;
    // The header's claim: for normal amax (and a normal product) TE's fp32 route is this rule.
    if (a >= 0x1p-100f) {
      ++te_checked;
      ASSERT_EQ(fr::mx_scale_exponent_round_up<F>(bits), te_round_up(a, static_cast<float>(max)))
          << name << " amax=" << a;
    }
  }
  EXPECT_GT(te_checked, 500u);
}

TEST(FormatsMx, PowerOfTwoBlockScaleRules) {
  EXPECT_EQ(fr::emax_elem<fr::E4M3>(), 8);
  EXPECT_EQ(fr::emax_elem<fr::E5M2>(), 15);
  EXPECT_EQ(fr::emax_elem<fr::E2M1>(), 2);
  check_mx_rules<fr::E4M3>("e4m3");
  check_mx_rules<fr::E5M2>("e5m2");
  check_mx_rules<fr::E2M1>("e2m1");
  // OCP: amax 448 -> 2^(8-8) = 1, 500 -> 1 as well (and 500 saturates to 448); round-up: 500 -> 2.
  EXPECT_EQ(fr::mx_scale_exponent_floor<fr::E4M3>(bits_of(500.0f)), 0);
  EXPECT_EQ(fr::mx_scale_exponent_round_up<fr::E4M3>(bits_of(448.0f)), 0);
  EXPECT_EQ(fr::mx_scale_exponent_round_up<fr::E4M3>(bits_of(500.0f)), 1);
  EXPECT_EQ(fr::mx_scale_exponent_floor<fr::E2M1>(bits_of(0.0f)), -127);
  EXPECT_EQ(fr::mx_scale_exponent_floor<fr::E2M1>(bits_of(1e-40f)), -127) << "clamped";
}

}  // namespace
