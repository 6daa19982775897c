// The block-scaled reference quantizer (block_scaling.h) against a second implementation written
// here from the header's definitions — double arithmetic with one explicit rounding to fp32 per
// fp32 step, element codes by nearest-value search over each format's written-out values — on
// tensors built to reach every case: magnitudes across fp32's range, subnormals, exact ties, zero,
// NaN and infinite blocks, partial trailing blocks, stochastic rounding. Where the peers venv
// imports ml_dtypes, numpy + ml_dtypes compute MX, NVFP4 and FP8 block scaling from the same
// definitions and must agree bit for bit. Also: the layouts' presets, bad layouts and buffers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "formats_test_util.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "mixtrain/sdk/support/float_format_rules.h"
#include "python_peers.h"

namespace {

using namespace formats_test;
using sdk::BlockElement;
using sdk::BlockScale;
using sdk::BlockScaledLayout;
using sdk::ReductionAxis;
namespace fr = mixtrain::sdk::format_rules;
namespace fs = std::filesystem;

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInfF = std::numeric_limits<float>::infinity();

float f32(double v) {
  return static_cast<float>(v);
}

struct Element {
  const std::vector<double>& values;  // positive finite values by code
  std::uint32_t sign, max_code;
  int emax;
};

Element element_of(BlockElement e) {
  switch (e) {
    case BlockElement::e4m3:
      return {positive_values(kE4M3), 0x80, 0x7E, 8};
    case BlockElement::e5m2:
      return {positive_values(kE5M2), 0x80, 0x7B, 15};
    case BlockElement::e2m1:
      return {e2m1_values(), 0x8, 0x7, 2};
  }
  std::abort();
}

// The element code of the exact value v (double): nearest, ties to even, saturating; or
// stochastically: up iff rbits < floor(fraction of the gap · 2^32), as the header defines it.
std::uint8_t element_code(const Element& el, double v, std::optional<std::uint32_t> rbits) {
  const std::uint32_t sign = std::signbit(v) ? el.sign : 0;
  const double a = std::fabs(v);
  std::uint32_t code;
  if (!rbits) {
    code = nearest_code(el.values, a, el.max_code);
  } else {
    const std::size_t top = el.values.size() - 1;
    std::size_t lo = 0;
    while (lo < top && el.values[lo + 1] <= a) ++lo;
    const double next = lo < top ? el.values[lo + 1] : 2 * el.values[top] - el.values[top - 1];
    const double fraction =
        (a - el.values[lo]) / (next - el.values[lo]);  // exact: a power-of-two gap
    const double threshold = std::floor(std::ldexp(std::min(fraction, 1.0), 32));
    code = static_cast<double>(*rbits) < threshold ? static_cast<std::uint32_t>(lo + 1)
                                                   : static_cast<std::uint32_t>(lo);
    if (a >= next) code = el.max_code;  // beyond the grid: saturated
    code = std::min(code, el.max_code);
  }
  return static_cast<std::uint8_t>(sign | code);
}

struct Reference {
  std::vector<std::uint8_t> codes;
  std::vector<float> scales;
  std::vector<std::uint8_t> scale_codes;
  float tensor_scale = 1.0f;
};

// The header's definitions, step by step.
Reference reference_quantize(const std::vector<float>& x, std::int64_t rows, std::int64_t cols,
                             const BlockScaledLayout& L, std::optional<std::uint64_t> seed) {
  const Element el = element_of(L.element);
  const double max = el.values.back();
  const std::int64_t gr = (rows + L.block_rows - 1) / L.block_rows;
  const std::int64_t gc = (cols + L.block_cols - 1) / L.block_cols;
  const bool fp32 = L.scale == BlockScale::fp32 || L.scale == BlockScale::fp32_pow2;
  Reference ref;
  ref.codes.assign(x.size(), 0);
  if (fp32)
    ref.scales.assign(static_cast<std::size_t>(gr * gc), 0.0f);
  else
    ref.scale_codes.assign(static_cast<std::size_t>(gr * gc), 0);

  std::vector<double> amax(static_cast<std::size_t>(gr * gc), 0.0);
  std::vector<bool> finite(amax.size(), true);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const double v = x[static_cast<std::size_t>(r * cols + c)];
      const auto b = static_cast<std::size_t>((r / L.block_rows) * gc + c / L.block_cols);
      if (!std::isfinite(v))
        finite[b] = false;
      else
        amax[b] = std::max(amax[b], std::fabs(v));
    }
  double s_enc = 1.0;
  if (L.tensor_scale) {
    double g = 0;
    for (std::size_t b = 0; b < amax.size(); ++b)
      if (finite[b]) g = std::max(g, amax[b]);
    if (g > 0) s_enc = std::isinf(f32(2688.0 / g)) ? FLT_MAX : f32(2688.0 / g);
    ref.tensor_scale = f32(1.0 / s_enc);
  }
  const double multiplier = f32(s_enc * static_cast<double>(f32(1.0 / 6.0)));

  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const auto i = static_cast<std::size_t>(r * cols + c);
      const auto b = static_cast<std::size_t>((r / L.block_rows) * gc + c / L.block_cols);
      if (!finite[b]) {
        if (fp32)
          ref.scales[b] = kNaN;
        else
          ref.scale_codes[b] = L.scale == BlockScale::e4m3 ? 0x7F : 0xFF;
        continue;
      }
      const double xv = x[i];
      double v = 0;  // the exact value the element encodes
      switch (L.scale) {
        case BlockScale::fp32:
        case BlockScale::fp32_pow2: {
          double s = 1.0;
          if (amax[b] > 0) {
            s = f32(max / amax[b]);
            if (std::isinf(s)) s = FLT_MAX;
            if (L.scale == BlockScale::fp32_pow2) s = std::ldexp(1.0, std::ilogb(s));
          }
          ref.scales[b] = f32(1.0 / s);
          v = f32(xv * s);
          break;
        }
        case BlockScale::e8m0:
        case BlockScale::e8m0_round_up: {
          const int k = L.scale == BlockScale::e8m0 ? mx_floor_definition(amax[b], el.emax)
                                                    : mx_round_up_definition(amax[b], max);
          ref.scale_codes[b] = static_cast<std::uint8_t>(k + 127);
          v = std::ldexp(xv, -k);
          break;
        }
        case BlockScale::e4m3: {
          const std::uint32_t d =
              nearest_code(positive_values(kE4M3), f32(amax[b] * multiplier), 0x7E);
          ref.scale_codes[b] = static_cast<std::uint8_t>(d);
          const double dq = value_of(kE4M3, d);
          const double e =
              dq == 0 ? 0.0 : std::min<double>(f32(1.0 / f32(dq * ref.tensor_scale)), FLT_MAX);
          v = f32(xv * e);
          break;
        }
      }
      std::optional<std::uint32_t> rbits;
      if (seed) rbits = fr::random_bits(*seed, i);
      ref.codes[i] = element_code(el, v, rbits);
    }
  return ref;
}

// Tensors that reach every case: per block a magnitude anywhere in fp32's range (2^-130 … 2^119,
// or within 2^±6 of 1 when `narrow`) and a spread of exponents inside it, plus blocks of exact
// ties, subnormals, zeros, one NaN, one inf.
std::vector<float> make_tensor(std::int64_t rows, std::int64_t cols, const BlockScaledLayout& L,
                               std::uint64_t seed, bool specials, bool narrow = false) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const std::int64_t gc = (cols + L.block_cols - 1) / L.block_cols;
  std::vector<int> block_kind, block_exp;
  const std::int64_t gr = (rows + L.block_rows - 1) / L.block_rows;
  for (std::int64_t b = 0; b < gr * gc; ++b) {
    block_kind.push_back(specials ? static_cast<int>(rng() % 10) : 0);
    block_exp.push_back(narrow ? static_cast<int>(rng() % 13) - 6
                               : static_cast<int>(rng() % 250) - 130);
  }
  const Element el = element_of(L.element);
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const auto b = static_cast<std::size_t>((r / L.block_rows) * gc + c / L.block_cols);
      const double sign = rng() % 2 ? -1.0 : 1.0;
      double v = 0;
      switch (block_kind[b]) {
        case 7:  // zeros (signed)
          v = sign * 0.0;
          break;
        case 8: {  // exact midpoints between element values, times a power of two
          const std::size_t i = rng() % (el.values.size() - 1);
          v = sign *
              std::ldexp((el.values[i] + el.values[i + 1]) / 2, static_cast<int>(rng() % 20) - 10);
          break;
        }
        case 9:  // fp32 subnormals
          v = sign * std::ldexp(u(rng), -126 - static_cast<int>(rng() % 20));
          break;
        default:
          v = sign * std::ldexp(1.0 + u(rng), block_exp[b] - static_cast<int>(rng() % 24));
      }
      x[static_cast<std::size_t>(r * cols + c)] = f32(v);
    }
  if (specials && rows * cols > 0) {
    // One NaN, one +inf, one -inf, each in its own position (possibly the same block).
    std::uniform_int_distribution<std::int64_t> at(0, rows * cols - 1);
    x[static_cast<std::size_t>(at(rng))] = kNaN;
    x[static_cast<std::size_t>(at(rng))] = kInfF;
    x[static_cast<std::size_t>(at(rng))] = -kInfF;
  }
  return x;
}

std::vector<BlockScaledLayout> all_layouts() {
  std::vector<BlockScaledLayout> v;
  for (ReductionAxis axis : {ReductionAxis::cols, ReductionAxis::rows}) {
    for (BlockElement e : {BlockElement::e4m3, BlockElement::e5m2}) {
      v.push_back(sdk::fp8_block_layout(axis, e, false));
      v.push_back(sdk::fp8_block_layout(axis, e, true));
      v.push_back(sdk::mx_layout(axis, e));
    }
    v.push_back(sdk::mx_layout(axis, BlockElement::e2m1));
    v.push_back(sdk::nvfp4_layout(axis));
  }
  v.push_back(sdk::fp8_block_weight_layout(BlockElement::e4m3, false));
  v.push_back(sdk::fp8_block_weight_layout(BlockElement::e4m3, true));
  v.push_back(sdk::nvfp4_weight_layout());
  v.push_back({BlockElement::e2m1, BlockScale::e4m3, 1, 16, false});  // NVFP4 without its 2nd level
  for (BlockElement e : {BlockElement::e4m3, BlockElement::e5m2, BlockElement::e2m1})
    v.push_back({e, BlockScale::e8m0_round_up, 1, 32, false});
  v.push_back({BlockElement::e4m3, BlockScale::e8m0, 3, 5, false});  // odd 2-D blocks
  v.push_back({BlockElement::e2m1, BlockScale::e4m3, 1, 1, true});   // one element per block
  return v;
}

std::string hex(std::uint32_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

void expect_same(const sdk::BlockScaledTensor& got, const Reference& want,
                 const std::string& what) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.codes.size(); ++i)
    if (got.codes[i] != want.codes[i] && ++bad <= 5)
      ADD_FAILURE() << what << ": code " << i << " is " << hex(got.codes[i]) << ", want "
                    << hex(want.codes[i]);
  EXPECT_EQ(bad, 0u) << what << ": codes differ";
  ASSERT_EQ(got.scales.size(), want.scales.size()) << what;
  ASSERT_EQ(got.scale_codes.size(), want.scale_codes.size()) << what;
  for (std::size_t b = 0; b < want.scales.size(); ++b)
    ASSERT_EQ(bits_of(got.scales[b]), bits_of(want.scales[b])) << what << ": scale " << b;
  for (std::size_t b = 0; b < want.scale_codes.size(); ++b)
    ASSERT_EQ(got.scale_codes[b], want.scale_codes[b]) << what << ": scale code " << b;
  EXPECT_EQ(bits_of(got.tensor_scale), bits_of(want.tensor_scale)) << what;
}

TEST(BlockScaling, MatchesTheDefinitionsOnEveryLayout) {
  for (const BlockScaledLayout& L : all_layouts()) {
    for (auto [rows, cols] : {std::pair<std::int64_t, std::int64_t>{64, 256}, {37, 301}, {5, 3}}) {
      for (std::optional<std::uint64_t> seed :
           {std::optional<std::uint64_t>{}, std::optional<std::uint64_t>{1234}}) {
        const std::vector<float> x = make_tensor(rows, cols, L, rows * 7919 + cols, true);
        const auto got = sdk::quantize_block_scaled(x, rows, cols, L, {seed});
        const Reference want = reference_quantize(x, rows, cols, L, seed);
        expect_same(got, want,
                    sdk::describe(L) + " on " + std::to_string(rows) + "x" + std::to_string(cols) +
                        (seed ? " (stochastic)" : ""));
      }
    }
  }
}

TEST(BlockScaling, DequantizeIsTheExactProductRoundedOnce) {
  for (const BlockScaledLayout& L : all_layouts()) {
    const std::vector<float> x = make_tensor(40, 130, L, 99, true);
    const auto t = sdk::quantize_block_scaled(x, 40, 130, L);
    const std::vector<float> y = sdk::dequantize_block_scaled(t);
    const Element el = element_of(L.element);
    for (std::int64_t r = 0; r < 40; ++r)
      for (std::int64_t c = 0; c < 130; ++c) {
        const auto i = static_cast<std::size_t>(r * 130 + c);
        const std::int64_t br = r / L.block_rows, bc = c / L.block_cols;
        const double scale = sdk::block_scale_value(t, br, bc);
        const std::uint8_t code = t.codes[i];
        const double value = (code & el.sign ? -1.0 : 1.0) * el.values[code & (el.sign - 1)];
        const float want = f32(value * scale * t.tensor_scale);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(y[i])) << sdk::describe(L) << " at " << i;
        } else {
          ASSERT_EQ(bits_of(y[i]), bits_of(want)) << sdk::describe(L) << " at " << i;
        }
      }
  }
}

// The quantization error of every element is what its format allows: half a step of the element
// grid around x·(encode scale), times the decode scale; a saturated element dequantizes to ±max
// times the scales. (For fp32 scales the decode scale is 1/s rounded, hence a relative slack.)
// NVFP4's block scales span E4M3's 2^-9 … 448 below the tensor's amax; the narrow tensor keeps
// every block inside it (a block below it has scale 0 and dequantizes to 0, checked too).
TEST(BlockScaling, ErrorsAreWithinHalfAStepOfTheElementGrid) {
  for (const BlockScaledLayout& L : all_layouts()) {
    const bool narrow = L.scale == BlockScale::e4m3;
    const std::vector<float> x = make_tensor(32, 256, L, 5, false, narrow);
    const auto t = sdk::quantize_block_scaled(x, 32, 256, L);
    const std::vector<float> y = sdk::dequantize_block_scaled(t);
    const Element el = element_of(L.element);
    const double max = el.values.back();
    std::size_t checked = 0;
    for (std::int64_t r = 0; r < 32; ++r)
      for (std::int64_t c = 0; c < 256; ++c) {
        const auto i = static_cast<std::size_t>(r * 256 + c);
        const double d =
            static_cast<double>(sdk::block_scale_value(t, r / L.block_rows, c / L.block_cols)) *
            t.tensor_scale;
        if (d == 0) {
          ASSERT_EQ(y[i], 0.0f) << sdk::describe(L) << " at " << i;
          continue;
        }
        const double scaled = x[i] / d;  // where x falls on the element grid
        const double a = std::fabs(scaled);
        std::size_t lo = 0;
        while (lo + 1 < el.values.size() && el.values[lo + 1] <= a) ++lo;
        const double gap = lo + 1 < el.values.size() ? el.values[lo + 1] - el.values[lo]
                                                     : el.values[lo] - el.values[lo - 1];
        const double slack = std::fabs(x[i]) * 0x1p-21 + 0x1p-149;
        if (a > max + gap / 2) {
          EXPECT_EQ(std::fabs(y[i]), f32(max * d)) << sdk::describe(L) << " saturated at " << i;
        } else {
          ASSERT_LE(std::fabs(y[i] - static_cast<double>(x[i])), gap / 2 * d + slack)
              << sdk::describe(L) << " at " << i << ": x=" << x[i] << " y=" << y[i];
        }
        ++checked;
      }
    EXPECT_GT(checked, 4000u) << sdk::describe(L);
  }
}

TEST(BlockScaling, ZeroBlocksAreZeroWithoutNaN) {
  const std::vector<float> zeros(64, 0.0f);
  for (const BlockScaledLayout& L : all_layouts()) {
    const auto t = sdk::quantize_block_scaled(zeros, 4, 16, L);
    for (std::uint8_t c : t.codes) ASSERT_EQ(c, 0) << sdk::describe(L);
    for (float v : sdk::dequantize_block_scaled(t)) ASSERT_EQ(bits_of(v), 0u) << sdk::describe(L);
    EXPECT_EQ(t.tensor_scale, 1.0f) << sdk::describe(L) << ": an all-zero tensor has S_enc = 1";
    switch (L.scale) {
      case BlockScale::fp32:
      case BlockScale::fp32_pow2:
        for (float s : t.scales) EXPECT_EQ(s, 1.0f) << sdk::describe(L);
        break;
      case BlockScale::e8m0:
      case BlockScale::e8m0_round_up:
        for (std::uint8_t s : t.scale_codes) EXPECT_EQ(s, 0x00) << sdk::describe(L) << ": 2^-127";
        break;
      case BlockScale::e4m3:
        for (std::uint8_t s : t.scale_codes) EXPECT_EQ(s, 0x00) << sdk::describe(L);
        break;
    }
  }
  // -0 keeps its sign in the codes.
  const auto t = sdk::quantize_block_scaled(std::vector<float>(16, -0.0f), 1, 16,
                                            sdk::nvfp4_layout(ReductionAxis::cols));
  for (std::uint8_t c : t.codes) EXPECT_EQ(c, 0x8);
}

TEST(BlockScaling, ANonFiniteBlockIsNaNAndLeavesTheOthersAlone) {
  for (const BlockScaledLayout& L : all_layouts()) {
    for (float bad : {kNaN, kInfF, -kInfF}) {
      std::vector<float> x = make_tensor(32, 64, L, 3, false);
      // Blow up one element of the block at (0, 0), which covers element (0, 0) in every layout.
      std::vector<float> zeroed = x;
      for (std::int64_t r = 0; r < std::min<std::int64_t>(L.block_rows, 32); ++r)
        for (std::int64_t c = 0; c < std::min<std::int64_t>(L.block_cols, 64); ++c)
          zeroed[static_cast<std::size_t>(r * 64 + c)] = 0.0f;
      x[0] = bad;
      const auto t = sdk::quantize_block_scaled(x, 32, 64, L);
      const auto z = sdk::quantize_block_scaled(zeroed, 32, 64, L);
      const std::vector<float> y = sdk::dequantize_block_scaled(t);
      EXPECT_TRUE(std::isnan(sdk::block_scale_value(t, 0, 0))) << sdk::describe(L);
      EXPECT_EQ(t.tensor_scale, z.tensor_scale) << sdk::describe(L);
      for (std::int64_t r = 0; r < 32; ++r)
        for (std::int64_t c = 0; c < 64; ++c) {
          const auto i = static_cast<std::size_t>(r * 64 + c);
          if (r < L.block_rows && c < L.block_cols) {
            ASSERT_EQ(t.codes[i], 0) << sdk::describe(L);
            ASSERT_TRUE(std::isnan(y[i])) << sdk::describe(L) << " at " << i;
          } else {
            ASSERT_EQ(t.codes[i], z.codes[i]) << sdk::describe(L) << " at " << i;
          }
        }
      const sdk::BlockExtent grid = sdk::block_grid(L, 32, 64);
      for (std::int64_t b = 1; b < grid.rows * grid.cols; ++b)
        ASSERT_EQ(bits_of(sdk::block_scale_value(t, b / grid.cols, b % grid.cols)),
                  bits_of(sdk::block_scale_value(z, b / grid.cols, b % grid.cols)))
            << sdk::describe(L) << " block " << b;
    }
  }
}

// The documented rule for a block shape that does not divide the tensor: the trailing blocks hold
// what is there, exactly as the zero-padded tensor's full blocks would.
TEST(BlockScaling, PartialBlocksQuantizeAsTheZeroPaddedTensor) {
  for (const BlockScaledLayout& L : all_layouts()) {
    const std::int64_t rows = 19, cols = 45;
    const sdk::BlockExtent grid = sdk::block_grid(L, rows, cols);
    const std::int64_t prow = grid.rows * L.block_rows, pcol = grid.cols * L.block_cols;
    const std::vector<float> x = make_tensor(rows, cols, L, 11, false);
    std::vector<float> padded(static_cast<std::size_t>(prow * pcol), 0.0f);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c)
        padded[static_cast<std::size_t>(r * pcol + c)] = x[static_cast<std::size_t>(r * cols + c)];
    const auto t = sdk::quantize_block_scaled(x, rows, cols, L);
    const auto p = sdk::quantize_block_scaled(padded, prow, pcol, L);
    EXPECT_EQ(t.scales, p.scales) << sdk::describe(L);
    EXPECT_EQ(t.scale_codes, p.scale_codes) << sdk::describe(L);
    EXPECT_EQ(t.tensor_scale, p.tensor_scale) << sdk::describe(L);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(t.codes[static_cast<std::size_t>(r * cols + c)],
                  p.codes[static_cast<std::size_t>(r * pcol + c)])
            << sdk::describe(L);
  }
  // A block larger than the tensor is one partial block.
  const auto t = sdk::quantize_block_scaled(std::vector<float>{1.0f, -2.0f, 3.0f}, 1, 3,
                                            sdk::fp8_block_weight_layout());
  EXPECT_EQ(t.scales.size(), 1u);
  EXPECT_EQ(t.scales[0], 1.0f / (448.0f / 3.0f)) << "amax 3 over the three elements present";
}

TEST(BlockScaling, StochasticRoundingIsSeededAndUnbiased) {
  const BlockScaledLayout L = sdk::nvfp4_layout(ReductionAxis::cols);
  const std::vector<float> x = make_tensor(16, 64, L, 21, false, true);
  const sdk::BlockQuantizeOptions a{42}, b{43};
  const auto t1 = sdk::quantize_block_scaled(x, 16, 64, L, a);
  const auto t2 = sdk::quantize_block_scaled(x, 16, 64, L, a);
  const auto t3 = sdk::quantize_block_scaled(x, 16, 64, L, b);
  EXPECT_EQ(t1.codes, t2.codes) << "a seed fixes the result";
  EXPECT_NE(t1.codes, t3.codes) << "another seed draws other bits";
  EXPECT_EQ(t1.scale_codes, t3.scale_codes) << "scales never round stochastically";
  // Unbiased: over 512 seeds the mean of each dequantized element approaches x. An element's
  // two candidates are at most one grid step (<= 2·d) apart, so the mean's standard error is at
  // most d/sqrt(512); 0.25·d is over 5 of those.
  std::vector<double> mean(x.size(), 0.0);
  const int seeds = 512;
  for (int s = 0; s < seeds; ++s) {
    const auto y =
        sdk::dequantize_block_scaled(sdk::quantize_block_scaled(x, 16, 64, L, {std::uint64_t(s)}));
    for (std::size_t i = 0; i < x.size(); ++i) mean[i] += static_cast<double>(y[i]) / seeds;
  }
  std::size_t checked = 0;
  for (std::int64_t r = 0; r < 16; ++r)
    for (std::int64_t c = 0; c < 64; ++c) {
      const auto i = static_cast<std::size_t>(r * 64 + c);
      const double d = static_cast<double>(sdk::block_scale_value(t1, r, c / 16)) * t1.tensor_scale;
      if (std::fabs(x[i]) >= 6 * d) continue;  // saturated: no longer unbiased
      ASSERT_NEAR(mean[i], x[i], 0.25 * d) << "element " << i;
      ++checked;
    }
  EXPECT_GT(checked, 900u);
}

TEST(BlockScaling, HandCheckedBlocks) {
  // MXFP8 E4M3, OCP rule: amax 500 -> 2^(8 - 8) = 1; 500 saturates to 448, 1.0625 ties to 1.
  {
    std::vector<float> x(32, 0.0f);
    x[0] = 500.0f, x[1] = 1.0625f, x[2] = -3.0f;
    const auto t = sdk::quantize_block_scaled(
        x, 1, 32, sdk::mx_layout(ReductionAxis::cols, BlockElement::e4m3));
    EXPECT_EQ(t.scale_codes[0], 127);
    EXPECT_EQ(t.codes[0], 0x7E);
    EXPECT_EQ(t.codes[1], 0x38);
    EXPECT_EQ(t.codes[2], 0xC4);
    // Round-up rule: 2^1, nothing saturates; 500 / 2 = 250 rounds to 256 in E4M3.
    BlockScaledLayout up = sdk::mx_layout(ReductionAxis::cols, BlockElement::e4m3);
    up.scale = BlockScale::e8m0_round_up;
    const auto u = sdk::quantize_block_scaled(x, 1, 32, up);
    EXPECT_EQ(u.scale_codes[0], 128);
    EXPECT_EQ(sdk::dequantize_block_scaled(u)[0], 512.0f);
  }
  // NVFP4: one block of 16 with amax 6 and global amax 6: S_enc = 448, block scale 448 (0x7E),
  // S_dec = 1/448; the elements are x itself.
  {
    std::vector<float> x = {6, -4, 3, 2, 1.5, 1, 0.5, 0, -0.5, 1.25, 5, 2.5, 0.25, 0.75, 1.75, 3.5};
    const auto t = sdk::quantize_block_scaled(x, 1, 16, sdk::nvfp4_layout(ReductionAxis::cols));
    EXPECT_EQ(t.scale_codes[0], 0x7E);
    EXPECT_EQ(t.tensor_scale, 1.0f / 448.0f);
    const std::vector<std::uint8_t> want = {0x7, 0xE, 0x5, 0x4, 0x3, 0x2, 0x1, 0x0,
                                            0x9, 0x2, 0x6, 0x4, 0x0, 0x2, 0x4, 0x6};
    EXPECT_EQ(t.codes, want) << "ties to even: 1.25 -> 1, 5 -> 4, 2.5 -> 2, 0.25 -> 0, 0.75 -> 1";
  }
  // FP8 block, fp32 scale: amax 2 -> s = 224, stored 1/224.
  {
    const auto t = sdk::quantize_block_scaled(std::vector<float>{2.0f, 1.0f}, 1, 2,
                                              sdk::fp8_block_layout(ReductionAxis::cols));
    EXPECT_EQ(t.scales[0], 1.0f / 224.0f);
    EXPECT_EQ(t.codes[0], 0x7E) << "448";
    EXPECT_EQ(t.codes[1], 0x76) << "224";
  }
  // Pow2: s = 224 rounds down to 128, stored 2^-7.
  {
    const auto t = sdk::quantize_block_scaled(
        std::vector<float>{2.0f, 1.0f}, 1, 2,
        sdk::fp8_block_layout(ReductionAxis::cols, BlockElement::e4m3, true));
    EXPECT_EQ(t.scales[0], 0x1p-7f);
  }
}

TEST(BlockScaling, LayoutsAndPresets) {
  EXPECT_EQ(sdk::fp8_block_layout(ReductionAxis::cols),
            (BlockScaledLayout{BlockElement::e4m3, BlockScale::fp32, 1, 128, false}));
  EXPECT_EQ(sdk::fp8_block_layout(ReductionAxis::rows, BlockElement::e5m2, true),
            (BlockScaledLayout{BlockElement::e5m2, BlockScale::fp32_pow2, 128, 1, false}));
  EXPECT_EQ(sdk::fp8_block_weight_layout(),
            (BlockScaledLayout{BlockElement::e4m3, BlockScale::fp32, 128, 128, false}));
  EXPECT_EQ(sdk::mx_layout(ReductionAxis::cols, BlockElement::e2m1),
            (BlockScaledLayout{BlockElement::e2m1, BlockScale::e8m0, 1, 32, false}));
  EXPECT_EQ(sdk::nvfp4_layout(ReductionAxis::rows),
            (BlockScaledLayout{BlockElement::e2m1, BlockScale::e4m3, 16, 1, true}));
  EXPECT_EQ(sdk::nvfp4_weight_layout(),
            (BlockScaledLayout{BlockElement::e2m1, BlockScale::e4m3, 16, 16, true}));
  EXPECT_EQ(sdk::describe(sdk::nvfp4_layout(ReductionAxis::cols)),
            "e2m1 1x16 e4m3 scales + fp32 tensor scale");
  const sdk::BlockExtent g = sdk::block_grid(sdk::fp8_block_weight_layout(), 300, 129);
  EXPECT_EQ(g.rows, 3);
  EXPECT_EQ(g.cols, 2);
  const auto empty =
      sdk::quantize_block_scaled({}, 0, 7, sdk::mx_layout(ReductionAxis::cols, BlockElement::e4m3));
  EXPECT_TRUE(empty.codes.empty());
  EXPECT_TRUE(empty.scale_codes.empty());
  EXPECT_TRUE(sdk::dequantize_block_scaled(empty).empty());
}

TEST(BlockScaling, PackE2M1LowNibbleFirst) {
  const std::vector<std::uint8_t> codes = {0x1, 0xF, 0x7, 0x8, 0x3};
  const std::vector<std::uint8_t> packed = sdk::pack_e2m1(codes);
  EXPECT_EQ(packed, (std::vector<std::uint8_t>{0xF1, 0x87, 0x03}));
  EXPECT_EQ(sdk::unpack_e2m1(packed, 5), codes);
  EXPECT_THROW(sdk::pack_e2m1(std::vector<std::uint8_t>{0x10}), std::invalid_argument);
  EXPECT_THROW(sdk::unpack_e2m1(packed, 7), std::invalid_argument);
}

// Runs `f`, expecting std::invalid_argument whose message contains `needle`.
template <class F>
void expect_invalid(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning \"" << needle << "\"";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(BlockScaling, BadLayoutsAndInputsAreRefusedWithAReason) {
  const std::vector<float> x(32, 1.0f);
  auto q = [&](BlockScaledLayout L, std::int64_t rows = 2, std::int64_t cols = 16) {
    return sdk::quantize_block_scaled(x, rows, cols, L);
  };
  expect_invalid(
      [&] {
        q({BlockElement::e4m3, BlockScale::fp32, 0, 128, false});
      },
      "block extents must be >= 1");
  expect_invalid(
      [&] {
        q({BlockElement::e4m3, BlockScale::fp32, 1, -32, false});
      },
      "block extents must be >= 1");
  expect_invalid(
      [&] {
        q({BlockElement::e2m1, BlockScale::fp32, 1, 16, false});
      },
      "fp32 block scales go with fp8");
  expect_invalid(
      [&] {
        q({BlockElement::e2m1, BlockScale::fp32_pow2, 1, 16, false});
      },
      "fp32 block scales go with fp8");
  expect_invalid(
      [&] {
        q({BlockElement::e4m3, BlockScale::e4m3, 1, 16, false});
      },
      "e4m3 block scales are NVFP4's");
  expect_invalid(
      [&] {
        q({BlockElement::e4m3, BlockScale::e8m0, 1, 32, true});
      },
      "per-tensor scale");
  expect_invalid(
      [&] {
        q({BlockElement::e4m3, BlockScale::fp32, 1, 32, true});
      },
      "per-tensor scale");
  expect_invalid(
      [&] {
        q({static_cast<BlockElement>(9), BlockScale::e8m0, 1, 32, false});
      },
      "unknown element format");
  expect_invalid(
      [&] {
        q({BlockElement::e4m3, static_cast<BlockScale>(9), 1, 32, false});
      },
      "unknown scale format");
  const BlockScaledLayout ok = sdk::mx_layout(ReductionAxis::cols, BlockElement::e4m3);
  expect_invalid([&] { q(ok, 3, 16); }, "was given 32 values");
  expect_invalid([&] { q(ok, -2, -16); }, "sizes must be >= 0");
  expect_invalid([&] { q(ok, std::int64_t{1} << 40, std::int64_t{1} << 40); }, "overflows");

  // Dequantize checks the buffers against the layout before reading them.
  const auto good = q(ok);
  auto broken = good;
  broken.codes.pop_back();
  expect_invalid([&] { sdk::dequantize_block_scaled(broken); }, "codes for a 2 x 16 tensor");
  broken = good;
  broken.scales.assign(broken.scale_codes.size(), 1.0f);
  broken.scale_codes.clear();
  expect_invalid([&] { sdk::dequantize_block_scaled(broken); }, "scale codes only");
  broken = good;
  broken.tensor_scale = 2.0f;
  expect_invalid([&] { sdk::dequantize_block_scaled(broken); }, "no second level");
  auto fp4 = sdk::quantize_block_scaled(x, 2, 16, sdk::nvfp4_layout(ReductionAxis::cols));
  fp4.codes[3] = 0x17;
  expect_invalid([&] { sdk::dequantize_block_scaled(fp4); }, "e2m1 code above 0xF");
  expect_invalid([&] { sdk::block_scale_value(good, 0, 1); }, "outside the 2 x 1 grid");
}

// ---- numpy + ml_dtypes -----------------------------------------------------------------------

struct TempDir {
  fs::path path =
      fs::temp_directory_path() / ("mixtrain_block_scaling_" + std::to_string(::getpid()) + "_" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  TempDir() { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// MX (both rules), NVFP4 (1-D and 2-D) and FP8 block scaling (both fp32 rules) in numpy float32
// arithmetic and ml_dtypes' casts, from the header's definitions; partial blocks by zero padding.
constexpr const char* kMlDtypesBlockScript = R"(import sys, numpy as np, ml_dtypes
d = sys.argv[1]
rows, cols = [int(v) for v in open(d + '/shape').read().split()]
x = np.fromfile(d + '/x.f32', dtype=np.float32).reshape(rows, cols)
F32MAX = np.float32(np.finfo(np.float32).max)
ELEM = {'e4m3': (ml_dtypes.float8_e4m3fn, 8), 'e5m2': (ml_dtypes.float8_e5m2, 15),
        'e2m1': (ml_dtypes.float4_e2m1fn, 2)}
for n, line in enumerate(open(d + '/layouts').read().split('\n')):
    if not line: continue
    elem, scale, br, bc, ts = line.split()
    br, bc, ts = int(br), int(bc), ts == '1'
    dt, emax = ELEM[elem]
    mx = np.float32(float(ml_dtypes.finfo(dt).max))
    R, C = -(-rows // br) * br, -(-cols // bc) * bc
    xp = np.zeros((R, C), np.float32); xp[:rows, :cols] = x
    blk = xp.reshape(R // br, br, C // bc, bc)
    fin = np.isfinite(blk).all(axis=(1, 3))
    amax = np.where(np.isfinite(blk), np.abs(blk), 0).max(axis=(1, 3)).astype(np.float32)
    expand = lambda s: np.repeat(np.repeat(s, br, axis=0), bc, axis=1)
    with np.errstate(all='ignore'):
        if scale.startswith('e8m0'):
            a64 = amax.astype(np.float64)
            e = np.frexp(a64)[1] - 1  # floor(log2 amax), exact
            if scale == 'e8m0':
                k = e - emax
            else:
                k = e - np.frexp(float(mx))[1]
                for _ in range(4):
                    k = np.where(a64 > np.ldexp(float(mx), k), k + 1, k)
            k = np.clip(np.where(amax == 0, -127, k), -127, 127)
            y = np.clip(xp.astype(np.float64) * np.ldexp(1.0, -expand(k)), -float(mx), float(mx))
            codes = y.astype(dt).view(np.uint8)
            sc = (k + 127).astype(np.uint8)
            assert (np.ldexp(np.float32(1), k.astype(np.int32)).astype(np.float32).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8) == sc).all()
            sc = np.where(fin, sc, np.uint8(0xFF)).astype(np.uint8)
        elif scale.startswith('fp32'):
            s = np.where(amax == 0, np.float32(1), mx / amax).astype(np.float32)
            s = np.where(np.isinf(s), F32MAX, s).astype(np.float32)
            if scale == 'fp32_pow2':
                s = np.ldexp(np.float32(1), np.frexp(s)[1] - 1).astype(np.float32)
            sc = np.where(fin, np.float32(1) / s, np.float32(np.nan)).astype(np.float32)
            y = np.clip(xp * expand(s), -mx, mx)
            codes = y.astype(dt).view(np.uint8)
        else:  # e4m3: NVFP4
            g = amax[fin].max() if fin.any() else np.float32(0)
            s_enc = np.float32(1)
            if ts and g > 0:
                s_enc = np.float32(2688) / np.float32(g)
                if np.isinf(s_enc): s_enc = F32MAX
            s_dec = np.float32(1) / s_enc if ts else np.float32(1)
            mult = np.float32(s_enc * np.float32(1.0 / 6.0))
            dq8 = np.minimum(amax * mult, np.float32(448)).astype(ml_dtypes.float8_e4m3fn)
            dq = dq8.astype(np.float32)
            enc = np.where(dq == 0, np.float32(0), np.minimum(np.float32(1) / (dq * s_dec), F32MAX)).astype(np.float32)
            y = np.clip(xp * expand(enc), -mx, mx)
            codes = y.astype(dt).view(np.uint8)
            sc = np.where(fin, dq8.view(np.uint8), np.uint8(0x7F)).astype(np.uint8)
            np.array([s_dec], np.float32).tofile('%s/ts%d.f32' % (d, n))
    codes = np.where(expand(fin), codes, np.uint8(0)).astype(np.uint8)[:rows, :cols]
    codes.tofile('%s/codes%d.u8' % (d, n))
    sc.tofile('%s/scales%d.bin' % (d, n))
)";

TEST(BlockScaling, NumpyAndMlDtypesAgreeBitForBit) {
  using mixtrain::test::peers_import;
  if (!peers_import("ml_dtypes"))
    GTEST_SKIP() << mixtrain::test::peers_missing_message(
        "ml_dtypes", "the block quantizers are still checked against the in-test reference");
  TempDir tmp;
  const std::vector<BlockScaledLayout> layouts = all_layouts();
  const std::int64_t rows = 70, cols = 300;
  // One tensor for all layouts, with blocks of every kind for the narrowest layout's grid.
  const std::vector<float> x =
      make_tensor(rows, cols, {BlockElement::e4m3, BlockScale::e8m0, 1, 16, false}, 77, true);
  {
    std::ofstream(tmp.path / "shape") << rows << " " << cols;
    std::ofstream out(tmp.path / "x.f32", std::ios::binary);
    out.write(reinterpret_cast<const char*>(x.data()),
              static_cast<std::streamsize>(x.size() * sizeof(float)));
    std::ofstream list(tmp.path / "layouts");
    const char* elements[] = {"e4m3", "e5m2", "e2m1"};
    const char* scales[] = {"fp32", "fp32_pow2", "e8m0", "e8m0_round_up", "e4m3"};
    for (const BlockScaledLayout& L : layouts)
      list << elements[static_cast<int>(L.element)] << " " << scales[static_cast<int>(L.scale)]
           << " " << L.block_rows << " " << L.block_cols << " " << (L.tensor_scale ? 1 : 0) << "\n";
  }
  std::ofstream(tmp.path / "block.py") << kMlDtypesBlockScript;
  const std::string cmd = mixtrain::test::peers_python() + " " + (tmp.path / "block.py").string() +
                          " " + tmp.path.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  auto read = [&](const std::string& name, std::size_t bytes) {
    std::vector<char> v(bytes);
    std::ifstream in(tmp.path / name, std::ios::binary);
    in.read(v.data(), static_cast<std::streamsize>(bytes));
    EXPECT_EQ(static_cast<std::size_t>(in.gcount()), bytes) << name;
    return v;
  };
  std::size_t total_bad = 0, total = 0;
  for (std::size_t n = 0; n < layouts.size(); ++n) {
    const BlockScaledLayout& L = layouts[n];
    const auto t = sdk::quantize_block_scaled(x, rows, cols, L);
    const auto codes = read("codes" + std::to_string(n) + ".u8", t.codes.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < t.codes.size(); ++i)
      if (static_cast<std::uint8_t>(codes[i]) != t.codes[i] && ++bad <= 3)
        ADD_FAILURE() << sdk::describe(L) << ": code " << i << " x=" << x[i] << " ml_dtypes "
                      << hex(static_cast<std::uint8_t>(codes[i])) << " ours " << hex(t.codes[i]);
    if (!t.scales.empty()) {
      const auto s = read("scales" + std::to_string(n) + ".bin", t.scales.size() * 4);
      for (std::size_t b = 0; b < t.scales.size(); ++b) {
        std::uint32_t want;
        std::memcpy(&want, s.data() + 4 * b, 4);
        const bool both_nan = std::isnan(from_bits(want)) && std::isnan(t.scales[b]);
        if (!both_nan && want != bits_of(t.scales[b]) && ++bad <= 3)
          ADD_FAILURE() << sdk::describe(L) << ": scale " << b << " ml_dtypes " << hex(want)
                        << " ours " << hex(bits_of(t.scales[b]));
      }
    } else {
      const auto s = read("scales" + std::to_string(n) + ".bin", t.scale_codes.size());
      for (std::size_t b = 0; b < t.scale_codes.size(); ++b)
        if (static_cast<std::uint8_t>(s[b]) != t.scale_codes[b] && ++bad <= 3)
          ADD_FAILURE() << sdk::describe(L) << ": scale code " << b << " ml_dtypes "
                        << hex(static_cast<std::uint8_t>(s[b])) << " ours "
                        << hex(t.scale_codes[b]);
    }
    if (L.scale == BlockScale::e4m3) {
      const auto ts = read("ts" + std::to_string(n) + ".f32", 4);
      std::uint32_t want;
      std::memcpy(&want, ts.data(), 4);
      EXPECT_EQ(want, bits_of(t.tensor_scale)) << sdk::describe(L);
    }
    EXPECT_EQ(bad, 0u) << sdk::describe(L);
    total_bad += bad;
    total += t.codes.size();
  }
  EXPECT_EQ(total_bad, 0u) << "mismatches over " << total << " codes in " << layouts.size()
                           << " layouts";
}

// NVFP4's random Hadamard transform: Sylvester's 16×16 matrix (built here by doubling
// [[1, 1], [1, -1]], independently of the popcount rule), its columns signed by the seed's bits,
// scaled by 1/4; orthogonal exactly; the same seed gives the same signs, others differ.
TEST(BlockScaling, Hadamard16IsSylvestersMatrixWithRandomColumnSignsAndOrthogonal) {
  std::vector<std::vector<int>> h = {{1}};
  while (h.size() < 16) {
    const std::size_t n = h.size();
    std::vector<std::vector<int>> g(2 * n, std::vector<int>(2 * n));
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        g[i][j] = g[i][j + n] = g[i + n][j] = h[i][j];
        g[i + n][j + n] = -h[i][j];
      }
    h = g;
  }
  std::vector<std::array<float, 256>> seen;
  for (std::uint64_t seed : {1ull, 2ull, 99ull, 123456789ull}) {
    SCOPED_TRACE(seed);
    const auto m = mixtrain::sdk::hadamard16(seed);
    EXPECT_EQ(m, mixtrain::sdk::hadamard16(seed));
    for (int j = 0; j < 16; ++j) {
      // Column j is ±(column j of H)/4, one sign for the whole column.
      const float sign = m[static_cast<std::size_t>(j)] * 4.0f * static_cast<float>(h[0][j]);
      ASSERT_TRUE(sign == 1.0f || sign == -1.0f);
      for (int i = 0; i < 16; ++i)
        EXPECT_EQ(m[static_cast<std::size_t>(i * 16 + j)],
                  sign * 0.25f * static_cast<float>(h[i][j]));
    }
    // MᵀM = I, in fp32 with no rounding (every product is ±1/16).
    for (int a = 0; a < 16; ++a)
      for (int b = 0; b < 16; ++b) {
        float dot = 0.0f;
        for (int i = 0; i < 16; ++i)
          dot += m[static_cast<std::size_t>(i * 16 + a)] * m[static_cast<std::size_t>(i * 16 + b)];
        EXPECT_EQ(dot, a == b ? 1.0f : 0.0f) << a << "," << b;
      }
    for (const auto& other : seen) EXPECT_NE(m, other);
    seen.push_back(m);
  }
}

}  // namespace
