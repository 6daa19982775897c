// The CUDA kernels' per-element math (plugins/backend_cuda/cuda_element_math.h) run on the CPU and
// checked against the references, so it is verified in CI without a GPU: the header is the same
// source the device compiles, using only operations IEEE-754 rounds the same on both (see its
// contract), so these bits are the device's bits.
// - Decodes: every bf16 and fp16 pattern (65536 each) and every fp8 pattern (256 each), bit for
//   bit against sdk/float_formats.h, NaNs included.
// - Encodes (bf16, fp16, e4m3, e5m2, saturating and not) and round_tf32: every value of every
//   format with the midpoints to its neighbours and the fp32 values either side of each midpoint
//   (every tie, every rounding boundary, max and overflow thresholds, subnormal boundaries), tie
//   and near-tie mantissas in every fp32 exponent, a stride over all 2^32 patterns, +-0, +-inf,
//   quiet / signalling / negative NaNs: bit for bit against the SDK.
// - tanh, gelu, gelu_grad against the CPU backend's formula with std::tanh, within stated ulps.
// - relu, the fp32 clamp, int32 stores, the amax fold and the softmax argmax against the CPU
//   backend's rules; the SGD and AdamW element steps against facets/cpu_optimizer.cpp, bit for bit.
// - The new facets' kernels modelled on the host from the same element functions, in the
//   kernels' order (lane partials and xor-shuffle trees included), against the CPU backend run
//   on the same inputs: residual add and its backward (the mask, the in-place gradient), dropout
//   (its mask is sdk::dropout_keeps on both), embedding gather and scatter_add bit for bit in
//   fp32/bf16/fp16; the attention softmax backward within 1 ulp (double sums in another order),
//   the forward within 4 ulps (exp_nonpos is not oneDNN's exp; exp_nonpos itself within 2 ulps of
//   the correctly rounded exp).
// - The quantized weight decodes (cuda_quantized_weight_math.h): NF4 and the six block-scaled
//   layouts a frozen base or the conformance suite uses, each element through the kernels'
//   functions against sdk::nf4_dequantize / sdk::dequantize_block_scaled, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_backend.h"
#include "cpu_softmax_row.h"
#include "cuda_element_math.h"
#include "cuda_quantized_weight_math.h"
#include "mixtrain/conformance/weight_layouts.h"
#include "mixtrain/sdk/support/adamw_step_constants.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "mixtrain/sdk/support/float_formats.h"
#include "mixtrain/sdk/support/nf4.h"

namespace {

namespace el = mixtrain::backend_cuda::element;
namespace st = mixtrain::backend_cuda::element::storage;
namespace sdk = mixtrain::sdk;

using u32 = std::uint32_t;

u32 bits(float x) { return std::bit_cast<u32>(x); }
float from_bits(u32 u) { return std::bit_cast<float>(u); }

sdk::Overflow overflow(bool saturate) {
  return saturate ? sdk::Overflow::saturate : sdk::Overflow::to_inf_or_nan;
}

std::string hex(u32 v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

// Distance in representable floats (both finite or both the same infinity).
std::int64_t ulp_distance(float a, float b) {
  auto ordered = [](float x) {
    const auto i = std::bit_cast<std::int32_t>(x);
    return i < 0 ? static_cast<std::int64_t>(INT32_MIN) - i : static_cast<std::int64_t>(i);
  };
  return std::llabs(ordered(a) - ordered(b));
}

// Spacing of the floats at magnitude s (the subnormal spacing below FLT_MIN).
double ulp_at(double s) {
  s = std::fabs(s);
  if (s < FLT_MIN) return std::ldexp(1.0, -149);
  int e = 0;
  std::frexp(s, &e);
  return std::ldexp(1.0, e - 24);
}

// --- the encode sample ---------------------------------------------------------------------------

template <class Decode>
void add_format_neighbourhoods(std::vector<float>& out, unsigned codes, Decode decode) {
  // Every finite non-negative value v of the format, the exact midpoint m to the next one up, and
  // the fp32 neighbours of m and v (all exact in fp32: the formats have at most 10 mantissa bits).
  std::vector<double> values;
  for (unsigned c = 0; c < codes; ++c) {
    const float v = decode(c);
    if (std::isfinite(v) && !std::signbit(v)) values.push_back(v);
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  // Past max: the next value with an unbounded exponent (2^128 for bf16: kept in double), so the
  // overflow threshold is the last midpoint.
  values.push_back(2.0 * values.back() - values[values.size() - 2]);
  for (std::size_t i = 0; i + 1 < values.size(); ++i) {
    const auto v = static_cast<float>(values[i]);
    const auto m = static_cast<float>((values[i] + values[i + 1]) / 2.0);
    for (float x : {v, std::nextafter(v, INFINITY), m, std::nextafter(m, 0.0f),
                    std::nextafter(m, INFINITY)}) {
      out.push_back(x);
      out.push_back(-x);
    }
  }
}

std::vector<float> encode_sample() {
  std::vector<float> out;
  add_format_neighbourhoods(out, 0x10000, [](unsigned c) { return sdk::decode_bf16(static_cast<std::uint16_t>(c)); });
  add_format_neighbourhoods(out, 0x10000, [](unsigned c) { return sdk::decode_fp16(static_cast<std::uint16_t>(c)); });
  add_format_neighbourhoods(out, 0x100, [](unsigned c) { return sdk::decode_fp8_e4m3(static_cast<std::uint8_t>(c)); });
  add_format_neighbourhoods(out, 0x100, [](unsigned c) { return sdk::decode_fp8_e5m2(static_cast<std::uint8_t>(c)); });
  // Every fp32 exponent (subnormals included): ties and near ties for each target's mantissa
  // width (tf32 10 bits, bf16 7, fp8 3 and 2), with even and odd kept parts, plus random mantissas.
  std::mt19937 rng(20240611);
  for (u32 e = 0; e < 255; ++e)
    for (u32 sign : {0u, 0x80000000u}) {
      for (int kept : {2, 3, 7, 10}) {
        const unsigned s = 23 - static_cast<unsigned>(kept);
        const u32 half = u32{1} << (s - 1);
        for (u32 q : {u32{0}, u32{1}, u32{2}, u32{3}, (u32{1} << kept) - 2, (u32{1} << kept) - 1})
          for (u32 low : {u32{0}, half - 1, half, half + 1, (half << 1) - 1})
            out.push_back(from_bits(sign | (e << 23) | ((q << s) | low)));
      }
      for (int k = 0; k < 32; ++k) out.push_back(from_bits(sign | (e << 23) | (rng() & 0x7FFFFFu)));
    }
  // A stride over every pattern (odd, so every low-bit pattern shows up).
  for (std::uint64_t u = 0; u <= 0xFFFFFFFFull; u += 65521) out.push_back(from_bits(static_cast<u32>(u)));
  // Specials: zeros, infinities, quiet / signalling / negative NaNs with assorted payloads.
  for (u32 b : {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u,
                0x7F800001u, 0xFF800001u, 0x7FA00000u, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x7FC12345u,
                0x7F802000u, 0x7F801FFFu, 0x00000001u, 0x807FFFFFu, 0x00800000u, 0x7F7FFFFFu})
    out.push_back(from_bits(b));
  return out;
}

const std::vector<float>& sample() {
  static const std::vector<float> s = encode_sample();
  return s;
}

// --- decodes ---------------------------------------------------------------------------------------

TEST(cuda_element_math, DecodesEveryBf16AndFp16PatternBitForBit) {
  int bad_bf16 = 0, bad_fp16 = 0;
  for (u32 c = 0; c < 0x10000; ++c) {
    const auto v = static_cast<std::uint16_t>(c);
    const u32 got_b = bits(st::Bf16::load(v)), want_b = bits(sdk::decode_bf16(v));
    const u32 got_h = bits(st::F16::load(v)), want_h = bits(sdk::decode_fp16(v));
    if (got_b != want_b && ++bad_bf16 <= 5)
      ADD_FAILURE() << "bf16 " << hex(c) << ": " << hex(got_b) << " want " << hex(want_b);
    if (got_h != want_h && ++bad_fp16 <= 5)
      ADD_FAILURE() << "fp16 " << hex(c) << ": " << hex(got_h) << " want " << hex(want_h);
  }
  EXPECT_EQ(bad_bf16, 0);
  EXPECT_EQ(bad_fp16, 0);
}

TEST(cuda_element_math, DecodesEveryFp8PatternBitForBit) {
  for (u32 c = 0; c < 0x100; ++c) {
    const auto v = static_cast<std::uint8_t>(c);
    EXPECT_EQ(bits(st::E4M3::load(v)), bits(sdk::decode_fp8_e4m3(v))) << "e4m3 " << hex(c);
    EXPECT_EQ(bits(st::E5M2::load(v)), bits(sdk::decode_fp8_e5m2(v))) << "e5m2 " << hex(c);
  }
}

// --- encodes ---------------------------------------------------------------------------------------

template <class S, class Ref>
void expect_encodes_match(const char* name, Ref ref) {
  const auto& xs = sample();
  for (bool saturate : {false, true}) {
    int bad = 0;
    for (float x : xs) {
      u32 got;
      if constexpr (std::is_same_v<typename S::T, float>)
        got = bits(S::store(x, saturate));
      else
        got = S::store(x, saturate);
      const u32 want = ref(x, overflow(saturate));
      if (got != want && ++bad <= 5)
        ADD_FAILURE() << name << (saturate ? " saturating" : "") << " of " << hex(bits(x)) << " ("
                      << x << "): " << hex(got) << " want " << hex(want);
    }
    EXPECT_EQ(bad, 0) << name << (saturate ? " saturating" : "") << ", " << xs.size() << " values";
  }
}

TEST(cuda_element_math, EncodesMatchTheSdkBitForBit) {
  ASSERT_GT(sample().size(), 700'000u);
  expect_encodes_match<st::Bf16>("bf16", [](float x, sdk::Overflow o) { return u32{sdk::encode_bf16(x, o)}; });
  expect_encodes_match<st::F16>("fp16", [](float x, sdk::Overflow o) { return u32{sdk::encode_fp16(x, o)}; });
  expect_encodes_match<st::E4M3>("e4m3", [](float x, sdk::Overflow o) { return u32{sdk::encode_fp8_e4m3(x, o)}; });
  expect_encodes_match<st::E5M2>("e5m2", [](float x, sdk::Overflow o) { return u32{sdk::encode_fp8_e5m2(x, o)}; });
  expect_encodes_match<st::Tf32>("tf32", [](float x, sdk::Overflow o) { return bits(sdk::round_to_tf32(x, o)); });
}

TEST(cuda_element_math, OverflowThresholdsAndNaNs) {
  // The first overflowing magnitudes of sdk/float_formats.h, spelled out.
  EXPECT_EQ(el::encode_fp16(65519.996f, false), 0x7BFF);
  EXPECT_EQ(el::encode_fp16(65520.0f, false), 0x7C00);
  EXPECT_EQ(el::encode_fp16(65520.0f, true), 0x7BFF);
  EXPECT_EQ(el::encode_bf16(from_bits(0x7F7F7FFF), false), 0x7F7F);
  EXPECT_EQ(el::encode_bf16(from_bits(0x7F7F8000), false), 0x7F80);
  EXPECT_EQ(el::encode_e5m2(61439.996f, false), 0x7B);
  EXPECT_EQ(el::encode_e5m2(61440.0f, false), 0x7C);
  EXPECT_EQ(el::encode_e4m3(464.0f, false), 0x7E);           // a tie, to even 448
  EXPECT_EQ(el::encode_e4m3(464.00003f, false), 0x7F);       // NaN: e4m3 has no inf
  EXPECT_EQ(el::encode_e4m3(-464.00003f, true), 0xFE);       // -448
  EXPECT_EQ(el::encode_e4m3(-INFINITY, false), 0xFF);
  EXPECT_EQ(el::round_tf32(from_bits(0x7F7FF000), true), from_bits(0x7F7FE000));
  // NaNs keep their sign (and top payload bits): what CUDA's conversion intrinsics do not do.
  EXPECT_EQ(el::encode_bf16(from_bits(0xFFC12345), true), 0xFFC1);
  EXPECT_EQ(el::encode_fp16(from_bits(0xFFC12345), true), 0xFE09);
  EXPECT_EQ(el::encode_e4m3(from_bits(0xFFC00000), true), 0xFF);
  EXPECT_EQ(el::encode_e5m2(from_bits(0x7FA00000), false), 0x7F);  // payload 01 kept, quieted
  EXPECT_EQ(el::encode_e5m2(from_bits(0xFF800001), false), 0xFE);  // signalling -NaN, quieted
}

TEST(cuda_element_math, Fp32ClampAndInt32Stores) {
  constexpr float kMax = std::numeric_limits<float>::max();
  for (float x : sample()) {
    // cpu_backend.cpp's saturating fp32 store; NaN compares false and stays (bits included).
    const float want = x > kMax ? kMax : (x < -kMax ? -kMax : x);
    EXPECT_EQ(bits(st::F32::store(x, true)), bits(want)) << hex(bits(x));
    EXPECT_EQ(bits(st::F32::store(x, false)), bits(x)) << hex(bits(x));
    EXPECT_EQ(bits(st::F32::load(x)), bits(x));
    if (std::isfinite(x) && std::fabs(x) < 2147483520.0f) {  // where static_cast is defined
      EXPECT_EQ(st::I32::store(x, false), static_cast<std::int32_t>(x)) << x;
    }
  }
  EXPECT_EQ(st::I32::store(std::nanf(""), false), 0);
  EXPECT_EQ(st::I32::store(3e9f, false), INT32_MAX);
  EXPECT_EQ(st::I32::store(-3e9f, false), INT32_MIN);
  EXPECT_EQ(st::I32::store(-INFINITY, false), INT32_MIN);
  EXPECT_EQ(st::I32::load(-7), -7.0f);
}

// --- activations -------------------------------------------------------------------------------------

// cpu_activation_kernels.cpp's portable formulas (its anonymous namespace; copied operation for
// operation).
constexpr float kGeluK = 0.7978845608028654f;
constexpr float kGeluC = 0.044715f;
float cpu_gelu(float x) {
  const float u = kGeluK * (x + kGeluC * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(u));
}
float cpu_gelu_grad(float x) {
  const float u = kGeluK * (x + kGeluC * x * x * x);
  const float t = std::tanh(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * x * x);
}

std::vector<float> activation_sample() {
  std::vector<float> xs;
  for (u32 u = 0; u < 0x41400000u; u += 997) {  // every 997th float in [0, 12), both signs
    xs.push_back(from_bits(u));
    xs.push_back(-from_bits(u));
  }
  for (std::uint64_t u = 0; u <= 0xFFFFFFFFull; u += 65521) xs.push_back(from_bits(static_cast<u32>(u)));
  for (float x : {0.625f, -0.625f, 10.0f, -10.0f, 1e30f, -1e30f, INFINITY, -INFINITY}) xs.push_back(x);
  return xs;
}

TEST(cuda_element_math, TanhWithinTwoUlpsOfCorrectlyRounded) {
  // Measured over every float in [0, 10]: at most 1 ulp from tanh computed in double and rounded
  // (2 from glibc's tanhf, which is itself up to 1 ulp off). Asserted: 2.
  std::int64_t worst = 0;
  for (float x : activation_sample()) {
    const float got = el::tanh_f32(x), want = static_cast<float>(std::tanh(static_cast<double>(x)));
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(got));
      continue;
    }
    const std::int64_t d = ulp_distance(got, want);
    worst = std::max(worst, d);
    EXPECT_LE(d, 2) << "tanh(" << x << ") = " << got << " want " << want;
  }
  EXPECT_EQ(bits(el::tanh_f32(-0.0f)), 0x80000000u);
  EXPECT_EQ(el::tanh_f32(INFINITY), 1.0f);
  EXPECT_EQ(el::tanh_f32(-INFINITY), -1.0f);
  std::printf("tanh_f32: worst %lld ulp(s) from the correctly rounded tanh\n", static_cast<long long>(worst));
}

// The bound is in ulps at the magnitude of the formula's terms, not of the result: where 1 + tanh
// (gelu, x << 0) or 1 - tanh^2 (gelu_grad) cancel, one ulp of tanh moves the result by |x|/2 ulps
// of 1 (gelu) or by x * t * K * (1 + 3C x^2) ulps of 1 (gelu_grad); both formulas cancel the same
// way on the CPU. Measured worst: 2 ulps for each; asserted: 4.
TEST(cuda_element_math, GeluAndGradMatchTheCpuFormula) {
  constexpr double kBound = 4.0;
  double worst_f = 0.0, worst_b = 0.0;
  for (float x : activation_sample()) {
    const float f = el::gelu(x), f_ref = cpu_gelu(x);
    const float b = el::gelu_grad(x), b_ref = cpu_gelu_grad(x);
    if (std::isnan(f_ref)) {
      EXPECT_TRUE(std::isnan(f)) << x;
    } else if (std::isinf(f_ref)) {
      EXPECT_EQ(f, f_ref) << x;
    } else {
      const double scale = std::max(std::fabs(static_cast<double>(f_ref)), 0.5 * std::fabs(x));
      const double e = std::fabs(static_cast<double>(f) - f_ref) / ulp_at(scale);
      worst_f = std::max(worst_f, e);
      EXPECT_LE(e, kBound) << "gelu(" << x << ") = " << f << " want " << f_ref;
    }
    if (std::isnan(b_ref)) {
      EXPECT_TRUE(std::isnan(b)) << x;
    } else if (std::isinf(b_ref)) {
      EXPECT_EQ(b, b_ref) << x;
    } else {
      const double ax = std::fabs(static_cast<double>(x));
      const double terms = 0.5 * (1.0 + ax * kGeluK * (1.0 + 3.0 * kGeluC * ax * ax));
      const double scale = std::max(std::fabs(static_cast<double>(b_ref)), std::min(terms, 1e30));
      const double e = std::fabs(static_cast<double>(b) - b_ref) / ulp_at(scale);
      worst_b = std::max(worst_b, e);
      EXPECT_LE(e, kBound) << "gelu_grad(" << x << ") = " << b << " want " << b_ref;
    }
  }
  std::printf("gelu: worst %.2f ulps, gelu_grad: worst %.2f ulps (at the terms' scale)\n", worst_f,
              worst_b);
}

TEST(cuda_element_math, ReluKeepsTheCpuComparisons) {
  const float qnan = from_bits(0x7FC12345), neg_nan = from_bits(0xFFC00001);
  EXPECT_EQ(bits(el::relu(qnan)), bits(qnan));  // NaN passes through, payload and all
  EXPECT_EQ(bits(el::relu(neg_nan)), bits(neg_nan));
  EXPECT_EQ(bits(el::relu(-0.0f)), 0x80000000u);  // -0 < 0 is false: -0 stays
  EXPECT_EQ(bits(el::relu(-1e-40f)), 0u);
  EXPECT_EQ(el::relu(-INFINITY), 0.0f);
  EXPECT_EQ(el::relu(INFINITY), INFINITY);
  EXPECT_EQ(el::relu(2.5f), 2.5f);
  EXPECT_EQ(el::relu_grad(qnan, 3.0f), 0.0f);
  EXPECT_EQ(el::relu_grad(0.0f, 3.0f), 0.0f);
  EXPECT_EQ(el::relu_grad(-0.0f, 3.0f), 0.0f);
  EXPECT_EQ(el::relu_grad(1e-45f, 3.0f), 3.0f);
  EXPECT_TRUE(std::isnan(el::relu_grad(1.0f, qnan)));
  for (float x : activation_sample()) {
    EXPECT_EQ(bits(el::activation<0>(x)), bits(x < 0.0f ? 0.0f : x));
    EXPECT_EQ(bits(el::activation_grad<0>(x, 0.75f)), bits(x > 0.0f ? 0.75f : 0.0f));
    EXPECT_EQ(bits(el::activation<1>(x)), bits(el::gelu(x)));
  }
}

// gemm_gradient's fallback (plugins/backend_cuda/cuda_gemm.h): an fp32 GEMM result z, then the
// activation-gradient kernel (kernels::activation_backward, dy = z in fp32) stores z · gelu'(pre)
// rounded once into C. Its element rule, composed as act_bwd_kernel composes it, against the CPU
// formula's z · gelu'(pre) rounded once by the SDK: not bit for bit (tanh_f32 is not std::tanh),
// but within the gelu_grad bound above (4 ulps at the terms' scale, times |z|) plus the product's
// rounding; a 16-bit C is the CPU's value or one unit of its format from it, and nearly always
// the same bits.
template <class Pre, class C>
void check_gradient_fallback(sdk::DType pre_t, sdk::DType c_t) {
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> zs(-4.0f, 4.0f), xs(-6.0f, 6.0f);
  constexpr int kSamples = 20000;
  int same_bits = 0;
  for (int i = 0; i < kSamples; ++i) {
    const typename Pre::T pre = Pre::store(xs(rng), false);  // the pre_activation as stored
    const float x = Pre::load(pre), z = zs(rng);
    const typename C::T stored = C::store(el::activation_grad<1>(x, st::F32::load(z)), false);
    const float got = C::load(stored);
    const float product = z * cpu_gelu_grad(x);
    const float want = c_t == sdk::DType::bf16   ? sdk::decode_bf16(sdk::encode_bf16(product))
                       : c_t == sdk::DType::fp16 ? sdk::decode_fp16(sdk::encode_fp16(product))
                                                 : product;
    const double ax = std::fabs(static_cast<double>(x));
    const double terms = 0.5 * (1.0 + ax * kGeluK * (1.0 + 3.0 * kGeluC * ax * ax));
    const double fp32_bound =
        std::fabs(z) * 4.0 * ulp_at(terms) + ulp_at(static_cast<double>(product));
    // One unit of C's format at the result (bf16: 8 significant bits, fp16: 11, subnormal 2^-24).
    const double unit = c_t == sdk::DType::bf16   ? ulp_at(want) * 0x1p16
                        : c_t == sdk::DType::fp16 ? std::max(ulp_at(want) * 0x1p13, 0x1p-24)
                                                  : 0.0;
    ASSERT_LE(std::fabs(static_cast<double>(got) - want), fp32_bound + unit)
        << "pre " << sdk::dtype_name(pre_t) << " C " << sdk::dtype_name(c_t) << ": x " << x << " z "
        << z << " got " << got << " want " << want;
    same_bits += bits(got) == bits(want);
  }
  std::printf("gemm_gradient fallback, pre %s, C %s: %d of %d the CPU's bits\n",
              std::string(sdk::dtype_name(pre_t)).c_str(),
              std::string(sdk::dtype_name(c_t)).c_str(), same_bits, kSamples);
  if (c_t != sdk::DType::fp32) {
    EXPECT_GE(same_bits, kSamples - kSamples / 100);
  }
}

TEST(cuda_element_math, GemmGradientFallbackRoundsTheProductOnceNearTheCpu) {
  check_gradient_fallback<st::F32, st::F32>(sdk::DType::fp32, sdk::DType::fp32);
  check_gradient_fallback<st::F32, st::Bf16>(sdk::DType::fp32, sdk::DType::bf16);
  check_gradient_fallback<st::F32, st::F16>(sdk::DType::fp32, sdk::DType::fp16);
  check_gradient_fallback<st::Bf16, st::F32>(sdk::DType::bf16, sdk::DType::fp32);
  check_gradient_fallback<st::Bf16, st::Bf16>(sdk::DType::bf16, sdk::DType::bf16);
  check_gradient_fallback<st::Bf16, st::F16>(sdk::DType::bf16, sdk::DType::fp16);
  check_gradient_fallback<st::F16, st::F32>(sdk::DType::fp16, sdk::DType::fp32);
  check_gradient_fallback<st::F16, st::Bf16>(sdk::DType::fp16, sdk::DType::bf16);
  check_gradient_fallback<st::F16, st::F16>(sdk::DType::fp16, sdk::DType::fp16);
}

// --- reductions' element rules ---------------------------------------------------------------------

// cpu_backend.cpp's cast amax: chunk maxima of |x| (NaN if any), folded into the slot.
float cpu_amax(float slot, const std::vector<float>& xs) {
  float amax = 0.0f;
  bool nan = false;
  for (float x : xs) {
    const float a = from_bits(bits(x) & 0x7FFFFFFFu);
    if (a != a)
      nan = true;
    else
      amax = std::max(amax, a);
  }
  return nan || std::isnan(slot) ? std::numeric_limits<float>::quiet_NaN() : std::max(slot, amax);
}

TEST(cuda_element_math, AmaxFoldMatchesTheCpuRuleInAnyBlockOrder) {
  std::mt19937 rng(7);
  const std::vector<float> specials = {0.0f, -0.0f, 1.0f, -3.5f, INFINITY, -INFINITY,
                                       from_bits(0x7FC00000), from_bits(0xFFA00000), 1e-45f};
  for (int trial = 0; trial < 20000; ++trial) {
    const std::size_t n = rng() % 9;
    std::vector<float> xs(n);
    for (float& x : xs)
      x = rng() % 4 == 0 ? specials[rng() % specials.size()]
                         : std::ldexp(static_cast<float>(rng() % 2000) - 1000.0f, static_cast<int>(rng() % 40) - 20);
    const float slot = rng() % 3 == 0 ? specials[rng() % specials.size()] : static_cast<float>(rng() % 100);
    // Blocks of 1..3 elements, folded in a shuffled order, as blocks of a grid land.
    std::vector<u32> block_max;
    for (std::size_t i = 0; i < n;) {
      const std::size_t len = std::min<std::size_t>(n - i, 1 + rng() % 3);
      u32 m = 0;
      for (std::size_t k = i; k < i + len; ++k) m = std::max(m, el::abs_bits(xs[k]));
      block_max.push_back(m);
      i += len;
    }
    if (block_max.empty()) block_max.push_back(0);  // an empty cast still folds in 0
    std::shuffle(block_max.begin(), block_max.end(), rng);
    u32 got = bits(slot);
    for (u32 m : block_max) got = el::amax_combine(got, m);
    EXPECT_EQ(hex(got), hex(bits(cpu_amax(slot, xs)))) << "trial " << trial;
  }
}

TEST(cuda_element_math, ArgmaxOfAWarpMatchesTheCpuScan) {
  std::mt19937 rng(11);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int trial = 0; trial < 20000; ++trial) {
    const int classes = 1 + static_cast<int>(rng() % 100);
    std::vector<float> z(static_cast<std::size_t>(classes));
    for (float& v : z) {
      const unsigned r = rng() % 10;
      v = r == 0 ? nan : (r == 1 ? INFINITY : static_cast<float>(static_cast<int>(rng() % 7) - 3));
    }
    // facets/cpu_loss.cpp's scan.
    float max_z = z[0];
    int cpu_arg = 0;
    for (int j = 1; j < classes; ++j)
      if (z[j] > max_z) {
        max_z = z[j];
        cpu_arg = j;
      }
    // softmax_xent_rows_kernel: 32 lanes scan strided slices, then an xor butterfly.
    float best[32];
    long long arg[32];
    for (int lane = 0; lane < 32; ++lane) {
      best[lane] = 0.0f;
      arg[lane] = -1;
      for (int j = lane; j < classes; j += 32) {
        const float v = z[static_cast<std::size_t>(j)];
        if (arg[lane] < 0 ? (j == 0 || v == v) : el::argmax_beats(v, j, best[lane], arg[lane])) {
          best[lane] = v;
          arg[lane] = j;
        }
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      float nb[32];
      long long na[32];
      for (int lane = 0; lane < 32; ++lane) {
        const int other = lane ^ o;
        const bool take = el::argmax_beats(best[other], arg[other], best[lane], arg[lane]);
        nb[lane] = take ? best[other] : best[lane];
        na[lane] = take ? arg[other] : arg[lane];
      }
      std::copy(nb, nb + 32, best);
      std::copy(na, na + 32, arg);
    }
    for (int lane = 0; lane < 32; ++lane) {
      ASSERT_EQ(arg[lane], cpu_arg) << "trial " << trial << " lane " << lane;
      ASSERT_EQ(bits(best[lane]), bits(max_z)) << "trial " << trial << " lane " << lane;
    }
  }
}

// --- optimizer steps ---------------------------------------------------------------------------------

struct Sgd {  // kernels::SgdArgs' fields
  float lr, momentum, dampening, weight_decay, grad_scale;
  bool nesterov, first_step, use_momentum;
};

TEST(cuda_element_math, OptimizerStepsMatchTheCpuBitForBit) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (int trial = 0; trial < 200000; ++trial) {
    const float p = u(rng), grad = u(rng) * 100.0f, buf0 = u(rng), m0 = u(rng) * 0.1f,
                v0 = std::fabs(u(rng)) * 0.01f;
    // cpu_optimizer_kernels.cpp's sgd loop.
    const float dampening = trial % 3 == 0 ? 0.1f : 0.0f;
    const Sgd h{0.05f, 0.9f, dampening, 1e-4f, 0.5f, dampening == 0.0f && trial % 2 == 0,
                trial % 5 == 0, true};
    float g = grad * h.grad_scale + h.weight_decay * p;
    const float damp = 1.0f - h.dampening;
    const float m = h.first_step ? g : h.momentum * buf0 + damp * g;
    g = h.nesterov ? g + h.momentum * m : m;
    float buf = buf0;
    EXPECT_EQ(bits(el::sgd_step<true>(h, p, grad, buf)), bits(p - h.lr * g));
    EXPECT_EQ(bits(buf), bits(m));
    float unused = 0.0f;
    EXPECT_EQ(bits(el::sgd_step<false>(h, p, grad, unused)),
              bits(p - h.lr * (grad * h.grad_scale + h.weight_decay * p)));
    // cpu_optimizer_kernels.cpp's AdamW loop, with the host's constants.
    sdk::AdamWHyper hyper;
    hyper.step = 1 + trial % 50;
    hyper.grad_scale = 0.25f;
    const sdk::AdamWStepConstants a = sdk::adamw_step_constants(hyper);
    const float ga = grad * a.grad_scale;
    const float mi = a.beta1 * m0 + (1.0f - a.beta1) * ga;
    const float vi = a.beta2 * v0 + (1.0f - a.beta2) * ga * ga;
    const float want = p * a.decay - a.step_size * mi / (std::sqrt(vi) / a.bc2_sqrt + a.eps);
    float mm = m0, vv = v0;
    EXPECT_EQ(bits(el::adamw_step(a, p, grad, mm, vv)), bits(want));
    EXPECT_EQ(bits(mm), bits(mi));
    EXPECT_EQ(bits(vv), bits(vi));
  }
}

// --- the facets' kernels modelled on the host, against the CPU backend ---------------------------

using sdk::DType;
using sdk::TensorView;

constexpr DType kStorage[] = {DType::fp32, DType::bf16, DType::fp16};

// A tensor in the CPU backend's (host) memory, filled through the kernels' storage encodes.
class HostTensor {
 public:
  HostTensor(mixtrain::backend_cpu::CpuBackend& cpu, DType dtype, sdk::Shape shape) : cpu_(&cpu) {
    view_.dtype = dtype;
    view_.shape = shape;
    view_.data = cpu.allocate(std::max<std::size_t>(view_.bytes(), 1));
    std::memset(view_.data, 0, view_.bytes());
  }
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;
  ~HostTensor() { cpu_->deallocate(view_.data); }
  operator TensorView() const { return view_; }
  const TensorView& view() const { return view_; }
  std::int64_t numel() const { return view_.numel(); }

  float get(std::int64_t i) const {
    switch (view_.dtype) {
      case DType::bf16:
        return st::Bf16::load(static_cast<const std::uint16_t*>(view_.data)[i]);
      case DType::fp16:
        return st::F16::load(static_cast<const std::uint16_t*>(view_.data)[i]);
      case DType::int32:
        return static_cast<float>(static_cast<const std::int32_t*>(view_.data)[i]);
      default:
        return static_cast<const float*>(view_.data)[i];
    }
  }
  void set(std::int64_t i, float v) {
    switch (view_.dtype) {
      case DType::bf16:
        static_cast<std::uint16_t*>(view_.data)[i] = st::Bf16::store(v, false);
        break;
      case DType::fp16:
        static_cast<std::uint16_t*>(view_.data)[i] = st::F16::store(v, false);
        break;
      case DType::int32:
        static_cast<std::int32_t*>(view_.data)[i] = static_cast<std::int32_t>(v);
        break;
      default:
        static_cast<float*>(view_.data)[i] = v;
        break;
    }
  }
  void set_all(const std::vector<float>& v) {
    for (std::size_t i = 0; i < v.size(); ++i) set(static_cast<std::int64_t>(i), v[i]);
  }
  std::vector<std::uint8_t> bytes() const {
    const auto* b = static_cast<const std::uint8_t*>(view_.data);
    return {b, b + view_.bytes()};
  }

 private:
  mixtrain::backend_cpu::CpuBackend* cpu_;
  TensorView view_;
};

// Bits of v stored as t (what a kernel's S::store writes).
std::vector<std::uint8_t> stored(const std::vector<float>& v, DType t) {
  std::vector<std::uint8_t> out(v.size() * sdk::dtype_size(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == DType::fp32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const std::uint16_t b =
          t == DType::bf16 ? st::Bf16::store(v[i], false) : st::F16::store(v[i], false);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

// Random values with the special ones the kernels must carry: ±0, ±inf, NaN, large and tiny.
std::vector<float> test_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  const float specials[] = {0.0f,     -0.0f,     INFINITY, -INFINITY, NAN,
                            65504.0f, -70000.0f, 1e-30f,   3.0e38f};
  for (std::size_t i = 0; i < std::size(specials) && 7 * i < n; ++i) v[7 * i] = specials[i];
  return v;
}

std::string dtypes_text(std::initializer_list<DType> ts) {
  std::string s;
  for (DType t : ts) s += std::string(sdk::dtype_name(t)) + " ";
  return s;
}

TEST(cuda_element_math, ResidualAddModelMatchesTheCpuBackendBitForBit) {
  mixtrain::backend_cpu::CpuBackend cpu(1);
  constexpr std::int64_t n = 1000;
  for (DType t1 : kStorage)
    for (DType t2 : kStorage)
      for (DType ty : kStorage)
        for (bool relu : {false, true}) {
          HostTensor x1(cpu, t1, sdk::Shape{n}), x2(cpu, t2, sdk::Shape{n}),
              x3(cpu, DType::bf16, sdk::Shape{n}), y(cpu, ty, sdk::Shape{n});
          x1.set_all(test_values(n, 1));
          x2.set_all(test_values(n, 2));
          x3.set_all(test_values(n, 3));
          const TensorView xs[] = {x1, x2, x3};
          sdk::facet<sdk::ResidualFacet>(cpu)->add(xs, relu, y);
          // cuda_residual.cu's kernel: decode each input, sum in order, residual_output, store.
          std::vector<float> model(n);
          for (std::int64_t i = 0; i < n; ++i) {
            float sum = x1.get(i);
            sum = sum + x2.get(i);
            sum = sum + x3.get(i);
            model[static_cast<std::size_t>(i)] = el::residual_output(sum, relu);
          }
          EXPECT_EQ(stored(model, ty), y.bytes())
              << dtypes_text({t1, t2, DType::bf16, ty}) << (relu ? "relu" : "");
        }
}

// residual_grad's mask: dy where y > 0, else +0 (y NaN, -0, negative); payloads and signs of dy
// kept where it passes and without the ReLU.
TEST(cuda_element_math, ResidualGradMasksToPositiveZeroAndKeepsDyBits) {
  const float nan_payload = from_bits(0xFFC12345u);
  EXPECT_EQ(bits(el::residual_grad(-3.0f, NAN, true)), 0u);
  EXPECT_EQ(bits(el::residual_grad(-3.0f, -0.0f, true)), 0u);
  EXPECT_EQ(bits(el::residual_grad(-3.0f, 0.0f, true)), 0u);
  EXPECT_EQ(bits(el::residual_grad(nan_payload, -1.0f, true)), 0u);
  EXPECT_EQ(bits(el::residual_grad(-0.0f, 2.0f, true)), bits(-0.0f));
  EXPECT_EQ(bits(el::residual_grad(nan_payload, 1e-40f, true)), 0xFFC12345u);
  EXPECT_EQ(bits(el::residual_grad(-3.0f, INFINITY, true)), bits(-3.0f));
  EXPECT_EQ(bits(el::residual_grad(nan_payload, NAN, false)), 0xFFC12345u);
  EXPECT_EQ(bits(el::residual_grad(-3.0f, -1.0f, false)), bits(-3.0f));
}

// cuda_residual.cu's backward kernel on the host: decode dy (and y) once, residual_grad, store
// into every gradient in its dtype; against the CPU's add_backward, with an empty gradient in the
// list and, in place, one gradient that is dy itself.
TEST(cuda_element_math, ResidualAddBackwardModelMatchesTheCpuBackendBitForBit) {
  mixtrain::backend_cpu::CpuBackend cpu(1);
  constexpr std::int64_t n = 1000;
  const std::vector<float> dy_values = test_values(n, 31);
  std::vector<float> y_values = test_values(n, 32);
  // Off the specials' slots of dy: NaN dy meets a positive y, NaN y a finite dy.
  std::rotate(y_values.begin(), y_values.begin() + 3, y_values.end());
  for (DType tdy : kStorage)
    for (DType ty : kStorage)
      for (DType tdx : kStorage)
        for (bool relu : {false, true})
          for (bool in_place : {false, true}) {
            HostTensor dy(cpu, tdy, sdk::Shape{n}), y(cpu, ty, sdk::Shape{n});
            HostTensor dx(cpu, tdx, sdk::Shape{n}), dx_bf16(cpu, DType::bf16, sdk::Shape{n});
            dy.set_all(dy_values);
            y.set_all(y_values);
            // The model reads dy before the CPU masks it in place.
            std::vector<float> model(n);
            for (std::int64_t i = 0; i < n; ++i)
              model[static_cast<std::size_t>(i)] = el::residual_grad(dy.get(i), y.get(i), relu);
            const TensorView dxs[] = {in_place ? dy.view() : dx.view(), TensorView{}, dx_bf16};
            sdk::facet<sdk::ResidualFacet>(cpu)->add_backward(dy, relu ? y.view() : TensorView{},
                                                              relu, dxs);
            const std::string what =
                dtypes_text({tdy, ty, tdx}) + (relu ? "relu " : "") + (in_place ? "in place" : "");
            EXPECT_EQ(stored(model, in_place ? tdy : tdx), in_place ? dy.bytes() : dx.bytes())
                << what;
            EXPECT_EQ(stored(model, DType::bf16), dx_bf16.bytes()) << what;
          }
}

TEST(cuda_element_math, DropoutModelMatchesTheCpuBackendBitForBit) {
  mixtrain::backend_cpu::CpuBackend cpu(1);
  constexpr std::int64_t n = 5000;
  const sdk::DropoutKey key{12345, 6};
  for (DType ti : kStorage)
    for (DType to : kStorage)
      for (float p : {0.0f, 0.1f, 0.5f, 0.9f}) {
        HostTensor x(cpu, ti, sdk::Shape{n}), y(cpu, to, sdk::Shape{n});
        x.set_all(test_values(n, 11));
        sdk::facet<sdk::DropoutFacet>(cpu)->dropout_forward(x, y, p, key);
        const std::uint32_t threshold = sdk::dropout_threshold(p);
        std::vector<float> model(n);
        for (std::int64_t i = 0; i < n; ++i)
          model[static_cast<std::size_t>(i)] = el::dropout_value(
              x.get(i), sdk::dropout_keeps(key, static_cast<std::uint64_t>(i), threshold),
              sdk::dropout_scale(p));
        EXPECT_EQ(stored(model, to), y.bytes()) << dtypes_text({ti, to}) << "p " << p;
      }
}

TEST(cuda_element_math, EmbeddingModelsMatchTheCpuBackendBitForBit) {
  mixtrain::backend_cpu::CpuBackend cpu(2);
  constexpr std::int64_t vocab = 37, width = 300, rows = 500;
  std::mt19937 rng(5);
  std::vector<float> id_values(rows);
  for (auto& v : id_values) v = static_cast<float>(rng() % 7 == 0 ? 3 : rng() % (vocab - 5));
  HostTensor ids(cpu, DType::int32, sdk::Shape{rows});
  ids.set_all(id_values);
  for (DType tt : kStorage)
    for (DType to : kStorage)
      for (bool accumulate : {false, true}) {
        HostTensor table(cpu, tt, sdk::Shape{vocab, width}), out(cpu, to, sdk::Shape{rows, width});
        table.set_all(test_values(vocab * width, 21));
        out.set_all(test_values(rows * width, 22));
        // cuda_embedding.cu's gather: out + table in FP32 (accumulate), else the value moved.
        std::vector<float> model(rows * width);
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t c = 0; c < width; ++c) {
            const float t = table.get(static_cast<std::int64_t>(id_values[r]) * width + c);
            model[r * width + c] =
                accumulate ? el::embedding_accumulate(out.get(r * width + c), t) : t;
          }
        sdk::facet<sdk::EmbeddingFacet>(cpu)->gather(ids, table, out, accumulate);
        EXPECT_EQ(stored(model, to), out.bytes())
            << "gather " << dtypes_text({tt, to}) << accumulate;
      }
  for (DType dt : kStorage)
    for (float beta : {0.0f, 1.0f}) {
      HostTensor dy(cpu, dt, sdk::Shape{rows, width}),
          dtable(cpu, DType::fp32, sdk::Shape{vocab, width});
      dy.set_all(test_values(rows * width, 31));
      dtable.set_all(test_values(vocab * width, 32));
      // The kernel's order: rows stably sorted by id, each id's rows summed in ascending order
      // from dtable's value (beta 1) or +0 (beta 0, the zeroed table).
      std::vector<std::int64_t> order(rows);
      for (std::int64_t r = 0; r < rows; ++r) order[r] = r;
      std::stable_sort(order.begin(), order.end(),
                       [&](std::int64_t a, std::int64_t b) { return id_values[a] < id_values[b]; });
      std::vector<float> model(vocab * width);
      for (std::int64_t i = 0; i < vocab * width; ++i)
        model[i] = beta == 0.0f ? 0.0f : dtable.get(i);
      for (std::int64_t r : order) {
        const auto v = static_cast<std::int64_t>(id_values[r]);
        for (std::int64_t c = 0; c < width; ++c)
          model[v * width + c] =
              el::embedding_accumulate(model[v * width + c], dy.get(r * width + c));
      }
      sdk::facet<sdk::EmbeddingFacet>(cpu)->scatter_add(ids, dy, dtable, beta);
      EXPECT_EQ(stored(model, DType::fp32), dtable.bytes())
          << "scatter_add " << dtypes_text({dt}) << "beta " << beta;
    }
}

TEST(cuda_element_math, ExpOfShiftedScoresWithinTwoUlpsOfCorrectlyRounded) {
  std::int64_t worst = 0;
  float worst_at = 0.0f;
  // Every 61st fp32 pattern from -0 down to -104 (~18 M values), then the edges.
  std::vector<float> zs;
  for (u32 b = 0x80000000u; b <= bits(-104.0f); b += 61) zs.push_back(from_bits(b));
  for (float z : {0.0f, -0.0f, -1e-45f, -0.5f, -0.6931472f, -87.33654f, -87.33655f, -88.0f, -100.0f,
                  -103.2789f, -103.97208f, -103.99f})
    zs.push_back(z);
  for (float z : zs) {
    const float want = static_cast<float>(std::exp(static_cast<double>(z)));
    const float got = el::exp_nonpos(z);
    ASSERT_TRUE(std::isfinite(got)) << z;
    const std::int64_t d = ulp_distance(got, want);
    if (d > worst) {
      worst = d;
      worst_at = z;
    }
  }
  std::printf("exp_nonpos: worst %lld ulps at z = %g over %zu values\n",
              static_cast<long long>(worst), static_cast<double>(worst_at), zs.size());
  EXPECT_LE(worst, 2) << "at z = " << worst_at;
  EXPECT_EQ(bits(el::exp_nonpos(-INFINITY)), 0u);
  EXPECT_EQ(bits(el::exp_nonpos(-1000.0f)), 0u);
  EXPECT_TRUE(std::isnan(el::exp_nonpos(NAN)));
  EXPECT_EQ(el::exp_nonpos(0.0f), 1.0f);
  EXPECT_EQ(el::exp_nonpos(-0.0f), 1.0f);
}

// The warp's double sum as the kernel forms it: lane l adds its keys l, l + 32, ... in order,
// then the xor-shuffle tree (every lane ends with the same value; lane 0's is returned).
double warp_sum_model(const std::vector<double>& terms) {
  double lane[32] = {};
  for (std::size_t j = 0; j < terms.size(); ++j) lane[j % 32] += terms[j];
  for (int o = 16; o > 0; o >>= 1) {
    double next[32];
    for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ o];
    std::copy(next, next + 32, lane);
  }
  return lane[0];
}

TEST(cuda_element_math, SoftmaxModelsMatchTheCpuBackend) {
  mixtrain::backend_cpu::CpuBackend cpu(1);
  const std::vector<std::pair<std::int64_t, std::int64_t>> sizes = {
      {16, 16}, {5, 77}, {1, 300}, {40, 40}};
  for (bool causal : {true, false})
    for (const auto& [rows, cols] : sizes) {
      const std::int64_t batch = 3, total = batch * rows * cols;
      const float scale = 0.125f;
      const sdk::SoftmaxShape shape{batch, rows, cols, causal};
      HostTensor s(cpu, DType::fp32, sdk::Shape{total}), p(cpu, DType::fp32, sdk::Shape{total});
      std::vector<float> sv = test_values(total, 41);
      for (auto& v : sv)
        if (!std::isfinite(v) || std::fabs(v) > 100.0f) v = 7.0f;  // finite rows here
      sv[3] = -0.0f;
      s.set_all(sv);
      sdk::facet<sdk::AttentionFacet>(cpu)->softmax_forward(s, shape, scale, p);
      // cuda_attention.cu's forward for every row.
      std::int64_t worst = 0;
      for (std::int64_t q = 0; q < batch * rows; ++q) {
        const std::int64_t visible = el::softmax_visible(rows, cols, q % rows, causal);
        ASSERT_EQ(visible, causal ? std::min(cols, q % rows + (cols - rows) + 1) : cols);
        float m = -INFINITY;
        for (std::int64_t j = 0; j < visible; ++j) m = el::softmax_max(m, scale * sv[q * cols + j]);
        std::vector<float> e(visible);
        std::vector<double> terms(visible);
        for (std::int64_t j = 0; j < visible; ++j) {
          e[j] = el::exp_nonpos(el::softmax_shifted(sv[q * cols + j], scale, m));
          terms[j] = e[j];
        }
        const double sum = warp_sum_model(terms);
        for (std::int64_t j = 0; j < cols; ++j) {
          const float got = j < visible ? el::softmax_normalise(e[j], sum) : 0.0f;
          const float want = p.get(q * cols + j);
          if (j >= visible) {
            ASSERT_EQ(bits(want), 0u);  // masked: exact +0 on both
            continue;
          }
          worst = std::max(worst, ulp_distance(got, want));
        }
      }
      std::printf("softmax %lldx%lld causal %d: forward worst %lld ulps\n",
                  static_cast<long long>(rows), static_cast<long long>(cols), causal ? 1 : 0,
                  static_cast<long long>(worst));
      EXPECT_LE(worst, 4) << "forward rows " << rows << " cols " << cols << " causal " << causal;

      // Backward on the CPU's own probabilities: the same inputs for both.
      HostTensor dp(cpu, DType::fp32, sdk::Shape{total}), ds(cpu, DType::fp32, sdk::Shape{total});
      std::vector<float> dpv = test_values(total, 42);
      for (auto& v : dpv)
        if (!std::isfinite(v) || std::fabs(v) > 100.0f) v = -1.5f;
      dp.set_all(dpv);
      sdk::facet<sdk::AttentionFacet>(cpu)->softmax_backward(p, dp, shape, scale, ds);
      std::int64_t worst_back = 0, equal = 0, compared = 0;
      for (std::int64_t q = 0; q < batch * rows; ++q) {
        const std::int64_t visible = el::softmax_visible(rows, cols, q % rows, causal);
        std::vector<double> terms(visible);
        for (std::int64_t j = 0; j < visible; ++j)
          terms[j] =
              static_cast<double>(dpv[q * cols + j]) * static_cast<double>(p.get(q * cols + j));
        const double dot = warp_sum_model(terms);
        for (std::int64_t j = 0; j < cols; ++j) {
          const float want = ds.get(q * cols + j);
          if (j >= visible) {
            ASSERT_EQ(bits(want), 0u);
            continue;
          }
          const float got = el::softmax_grad(p.get(q * cols + j), dpv[q * cols + j], dot, scale);
          worst_back = std::max(worst_back, ulp_distance(got, want));
          equal += bits(got) == bits(want) ? 1 : 0;
          ++compared;
        }
      }
      EXPECT_LE(worst_back, 1) << "backward rows " << rows << " cols " << cols;
      EXPECT_GE(equal * 100, compared * 99)
          << "backward: bit-equal " << equal << " of " << compared;
    }
}

TEST(cuda_element_math, SoftmaxStepsFollowTheCpuExpressions) {
  // cpu_attention.cpp: std::max(max_z, scale * s), scale * s - max_z,
  // float(double(p) / sum), float(double(scale) * p * (dp - dot)).
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-50.0f, 50.0f);
  for (int i = 0; i < 100000; ++i) {
    const float a = dist(rng), b = dist(rng), scale = dist(rng) / 50.0f;
    EXPECT_EQ(bits(el::softmax_max(a, b)), bits(std::max(a, b)));
    EXPECT_EQ(bits(el::softmax_shifted(a, scale, b)), bits(scale * a - b));
    const double sum = std::fabs(static_cast<double>(b)) + 1.0;
    const float e = std::fabs(a) / 50.0f;
    EXPECT_EQ(bits(el::softmax_normalise(e, sum)),
              bits(static_cast<float>(static_cast<double>(e) / sum)));
    const double dot = static_cast<double>(b) * 0.37;
    EXPECT_EQ(bits(el::softmax_grad(e, a, dot, scale)),
              bits(static_cast<float>(static_cast<double>(scale) * e * (a - dot))));
  }
  EXPECT_EQ(bits(el::softmax_max(-INFINITY, NAN)), bits(-INFINITY));  // std::max keeps its first
  EXPECT_EQ(bits(el::softmax_max(1.0f, NAN)), bits(1.0f));
}

// The kernel's label smoothing steps are the CPU backend's expressions: with the CPU's own p,
// log-sum-exp and Σ z per row (softmax_row, cpu_softmax_row.h), xent_grad gives its dlogits and
// xent_row_loss its loss, bit for bit, the rows' losses summed in order; eps = 0 is plain
// cross-entropy's targets and row loss exactly.
TEST(cuda_element_math, CrossEntropySmoothingFollowsTheCpuBackend) {
  mixtrain::backend_cpu::CpuBackend cpu(1);  // one thread: the CPU's loss sum in row order
  const std::int64_t rows = 9, classes = 37;
  std::vector<float> zv = test_values(rows * classes, 51);
  for (auto& v : zv)
    if (!std::isfinite(v) || std::fabs(v) > 30.0f) v = -2.5f;
  std::vector<float> labels;
  for (std::int64_t r = 0; r < rows; ++r) labels.push_back(static_cast<float>((r * 5) % classes));
  HostTensor z(cpu, DType::fp32, sdk::Shape{rows, classes}), y(cpu, DType::int32, sdk::Shape{rows});
  HostTensor loss(cpu, DType::fp32, sdk::Shape{1}), dz(cpu, DType::fp32, sdk::Shape{rows, classes});
  z.set_all(zv);
  std::vector<std::int32_t> ids(labels.begin(), labels.end());
  cpu.copy_from_host(y, ids.data());
  for (const float eps : {0.0f, 0.1f, 0.3f, 1.0f}) {
    const float grad_scale = 64.0f;
    sdk::facet<sdk::LossFacet>(cpu)->softmax_cross_entropy(z, y, grad_scale, eps, loss, {}, dz);
    const float factor = grad_scale / static_cast<float>(rows);
    const float on = el::xent_target_on(eps, classes), off = el::xent_target_off(eps, classes);
    double loss_sum = 0.0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = zv.data() + r * classes;
      std::vector<float> p(static_cast<std::size_t>(classes));
      const auto stats = mixtrain::backend_cpu::softmax_row(row, classes, p.data(), true);
      const std::int32_t label = ids[static_cast<std::size_t>(r)];
      loss_sum += el::xent_row_loss(stats.lse, row[label], stats.z_sum, eps, classes);
      for (std::int64_t j = 0; j < classes; ++j) {
        ASSERT_EQ(
            bits(el::xent_grad(p[static_cast<std::size_t>(j)], j == label ? on : off, factor)),
            bits(dz.get(r * classes + j)))
            << "eps " << eps << " row " << r << " class " << j;
      }
    }
    EXPECT_EQ(bits(static_cast<float>(loss_sum / static_cast<double>(rows))), bits(loss.get(0)))
        << "eps " << eps;
  }
  EXPECT_EQ(el::xent_target_on(0.0f, 1000), 1.0f);
  EXPECT_EQ(bits(el::xent_target_off(0.0f, 1000)), 0u);
  EXPECT_EQ(el::xent_row_loss(2.5, 1.25f, 123.0, 0.0f, 7), 2.5 - 1.25);
}

// The kernel's probability (cuda_loss.cu): each class's shifted exponential, the one the row's
// sum adds, times the row's reciprocal sum rounded to fp32, as the CPU's softmax_row forms it.
// Against a double e^(z - lse) it is within a few ulp beyond what rounding z - max to fp32 moves
// it by, the bound the CPU backend's p meets on the same row (its absolute error is far below a
// bf16 dlogit's rounding); a row's probabilities sum to 1 within fp32 rounding. Rows of GPT-2's
// padded head and a small one, logits spread over [-30, 30] (p down to about e^-60).
TEST(cuda_element_math, CrossEntropyProbabilityIsTheExponentialTimesTheRoundedReciprocalSum) {
  std::mt19937 rng(77);
  for (const std::int64_t classes : {std::int64_t{37}, std::int64_t{50304}}) {
    for (const float spread : {1.0f, 30.0f}) {
      std::uniform_real_distribution<float> dist(-spread, spread);
      std::vector<float> z(static_cast<std::size_t>(classes));
      for (auto& v : z) v = dist(rng);
      const float max = *std::max_element(z.begin(), z.end());
      double total = 0.0;  // the kernel's sum: fp32 exponentials added in double
      for (const float v : z) total += static_cast<double>(expf(v - max));
      const double lse = static_cast<double>(max) + std::log(total);
      const float inverse = el::xent_inverse_sum(total);
      std::vector<float> cpu_p(z.size());
      (void)mixtrain::backend_cpu::softmax_row(z.data(), classes, cpu_p.data(), false);
      double p_sum = 0.0, worst_exact = 0.0, worst_cpu = 0.0;  // ulp beyond the argument's
      for (std::size_t j = 0; j < z.size(); ++j) {
        const float p = el::xent_probability(z[j], max, inverse);
        const double exact = std::exp(static_cast<double>(z[j]) - lse);
        // Errors in units of the exact value's fp32 ulp (its spacing at that magnitude), less
        // what rounding z - max to fp32 moves e^(z - max) by (half an ulp of the argument,
        // relative), which the CPU's p has too.
        const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
        const double argument = std::fabs(static_cast<double>(z[j]) - max) * 0x1p-24 * exact;
        const auto excess = [&](double v) {
          return std::max(0.0, std::fabs(v - exact) - argument) / ulp;
        };
        worst_exact = std::max(worst_exact, excess(p));
        worst_cpu = std::max(worst_cpu, excess(cpu_p[j]));
        p_sum += p;
      }
      const std::string what =
          std::to_string(classes) + " classes, logits in +-" + std::to_string(spread);
      EXPECT_LE(worst_exact, 4.0) << what;
      EXPECT_LE(worst_cpu, 4.0) << what << ": the CPU's p, the same bound";
      EXPECT_NEAR(p_sum, 1.0, 1e-5) << what;
    }
  }
  // The label's probability of a row whose other logits are far below is 1, as the double
  // exponential gave: e^0 = 1 times 1 / (1 + tiny) rounded.
  EXPECT_EQ(el::xent_probability(3.0f, 3.0f, el::xent_inverse_sum(1.0 + 1e-12)), 1.0f);
  // A NaN sum (a NaN or +inf logit) makes every probability NaN, as lse NaN did.
  EXPECT_TRUE(std::isnan(el::xent_probability(1.0f, 2.0f, el::xent_inverse_sum(std::nan("")))));
}

namespace qw = mixtrain::backend_cuda::quantized;

// Every element of NF4 tensors (odd sizes and block sizes: blocks that start on a low nibble, a
// partial last block, a block of zeros) decodes as the SDK's reference does, bit for bit.
TEST(CudaElementMath, Nf4DecodeIsTheSdkReference) {
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (const std::int64_t block : {64, 63, 48, 1})
    for (const std::int64_t n : {1, 77, 4096 + 5}) {
      std::vector<float> x(static_cast<std::size_t>(n));
      for (float& v : x) v = normal(rng);
      for (std::size_t i = 0; i < x.size() && i < 64; ++i) x[i] = 0.0f;
      const sdk::Nf4Tensor q = sdk::nf4_quantize(x, block);
      const std::vector<float> want = sdk::nf4_dequantize(q);
      for (std::int64_t i = 0; i < n; ++i) {
        const float got =
            qw::nf4_value(qw::nf4_code(q.codes.data(), i),
                          q.absmax[static_cast<std::size_t>(i / block)], sdk::kNf4Codebook);
        ASSERT_EQ(bits(got), bits(want[static_cast<std::size_t>(i)]))
            << "element " << i << " of " << n << ", block " << block;
      }
    }
}

// Every element of the block-scaled layouts (fp32, pow2, E8M0 and E4M3 scales, E4M3, E5M2 and
// packed E2M1 codes, NVFP4's tensor scale) decodes as sdk::dequantize_block_scaled, bit for bit.
TEST(CudaElementMath, BlockScaledDecodeIsTheSdkReference) {
  const std::vector<sdk::BlockScaledLayout> layouts =
      mixtrain::conformance::block_scaled_weight_layouts();
  std::mt19937 rng(22);
  std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
  for (const auto& layout : layouts)
    for (const auto& [rows, cols] :
         {std::pair<std::int64_t, std::int64_t>{130, 70}, {7, 37}, {1, 1}, {256, 129}}) {
      std::vector<float> x(static_cast<std::size_t>(rows * cols));
      for (float& v : x) v = uniform(rng);
      for (std::size_t i = 0; i < x.size() && i < 16; ++i) x[i] = 0.0f;  // a zero block
      if (x.size() > 40) x[40] = 900.0f;                                 // an outlier
      const sdk::BlockScaledTensor q = sdk::quantize_block_scaled(x, rows, cols, layout);
      const std::vector<float> want = sdk::dequantize_block_scaled(q);
      const bool packed = layout.element == sdk::BlockElement::e2m1;
      const std::vector<std::uint8_t> codes = packed ? sdk::pack_e2m1(q.codes) : q.codes;
      const qw::ScaleCode kind = qw::scale_code_of(layout.scale);
      const void* scales = kind == qw::ScaleCode::fp32
                               ? static_cast<const void*>(q.scales.data())
                               : static_cast<const void*>(q.scale_codes.data());
      const sdk::BlockExtent grid = sdk::block_grid(layout, rows, cols);
      const qw::Element element = qw::element_of(layout.element);
      for (std::int64_t i = 0; i < rows * cols; ++i) {
        const std::int64_t r = i / cols, c = i % cols;
        const float scale = qw::block_scale(
            scales, kind, (r / layout.block_rows) * grid.cols + c / layout.block_cols);
        const float got = qw::block_scaled_value(
            qw::element_value(element, qw::element_code(codes.data(), packed, i)), scale,
            layout.tensor_scale ? q.tensor_scale : 1.0f);
        ASSERT_EQ(bits(got), bits(want[static_cast<std::size_t>(i)]))
            << sdk::describe(layout) << " [" << rows << ", " << cols << "] element " << i;
      }
    }
}

}  // namespace

namespace {

// count_underflow's per-value rule (gradient_check 1.2): against the SDK's encoders, a value the
// format stores as zero is flushed exactly when its magnitude is at most the format's threshold
// (half its smallest subnormal), over random bit patterns of every class, NaN and zero included.
TEST(CudaElementMath, UnderflowFlagsAreWhatTheFormatsStoreAsZero) {
  struct Format {
    const char* name;
    float threshold;
    bool (*zero)(float);
  };
  const Format formats[] = {
      {"bf16", std::ldexp(1.0f, -134),
       [](float v) { return sdk::decode_bf16(sdk::encode_bf16(v)) == 0.0f; }},
      {"fp16", std::ldexp(1.0f, -25),
       [](float v) { return sdk::decode_fp16(sdk::encode_fp16(v)) == 0.0f; }},
      {"e4m3", std::ldexp(1.0f, -10),
       [](float v) {
         return sdk::decode_fp8_e4m3(sdk::encode_fp8_e4m3(v, sdk::Overflow::saturate)) == 0.0f;
       }},
      {"e5m2", std::ldexp(1.0f, -17), [](float v) {
         return sdk::decode_fp8_e5m2(sdk::encode_fp8_e5m2(v, sdk::Overflow::saturate)) == 0.0f;
       }}};
  std::mt19937 gen(11);
  std::uniform_int_distribution<u32> any;
  for (const Format& f : formats) {
    const u32 near = bits(f.threshold);
    std::vector<float> values = {0.0f,
                                 -0.0f,
                                 std::numeric_limits<float>::quiet_NaN(),
                                 std::numeric_limits<float>::infinity(),
                                 f.threshold,
                                 -f.threshold};
    for (int i = 0; i < 20000; ++i) {
      values.push_back(from_bits(any(gen)));
      values.push_back(from_bits(near - 4096 + any(gen) % 8192) * (i % 2 ? -1.0f : 1.0f));
    }
    for (const float v : values) {
      const bool kept = v != 0.0f;
      const int want = kept ? (f.zero(v) ? 3 : 1) : 0;
      ASSERT_EQ(el::underflow_flags(v, f.threshold), want) << f.name << " " << hex(bits(v));
    }
  }
}

}  // namespace
