// Mixed precision on the CPU backend: bf16 / fp16 / fp8 GEMMs against a double reference on the
// decoded operands (exact inputs, so the tolerance only covers fp32 accumulation), every transpose,
// 16-bit C = the fp32 result rounded once (bit for bit), oneDNN bf16 vs emulated bf16, casts for
// every pair of float dtypes against the SDK's scalar conversions (saturation, amax, NaN),
// mixed-dtype kernels, scratch accounting and the small-tensor single-thread paths.
#include <algorithm>
#include <bit>
#include <limits>
#include <tuple>

#include "backend_test_util.h"
#include "cpu_eltwise.h"
#include "mixtrain/sdk/backend_activation.h"
#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cpu::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// op(A)[m,k] op(B)[k,n] in double, from decoded (exact) operand values.
std::vector<double> reference(const std::vector<float>& a, bool ta, const std::vector<float>& b,
                              bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                              double a_scale, double b_scale) {
  std::vector<double> out(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double av = ta ? a[static_cast<std::size_t>(p * m + i)] : a[static_cast<std::size_t>(i * k + p)];
        const double bv = tb ? b[static_cast<std::size_t>(j * k + p)] : b[static_cast<std::size_t>(p * n + j)];
        acc += av * a_scale * bv * b_scale;
      }
      out[static_cast<std::size_t>(i * n + j)] = acc;
    }
  return out;
}

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }

// A dtype, B dtype, transpose A, transpose B.
using MixedCase = std::tuple<DType, DType, bool, bool>;
class backend_cpu_mixed_gemm : public ::testing::TestWithParam<MixedCase> {};

TEST_P(backend_cpu_mixed_gemm, MatchesDoubleReferenceOnDecodedOperands) {
  const auto [a_dt, b_dt, ta, tb] = GetParam();
  for (Bf16GemmPath path : {Bf16GemmPath::automatic, Bf16GemmPath::onednn, Bf16GemmPath::emulated}) {
    CpuBackend be(2, path);
    for (const auto& [m, n, k] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{7, 13, 5},
                                  {33, 17, 70},
                                  {64, 48, 129}}) {
      // fp8 operands carry a scale: stored values span the format, scale_inv brings them back.
      const float a_scale_inv = sdk::is_fp8(a_dt) ? 0.125f : 1.0f;
      const float b_scale_inv = sdk::is_fp8(b_dt) ? 4.0f : 1.0f;
      const auto a = representable(random_values(static_cast<std::size_t>(m * k), 51, -8.0f, 8.0f), a_dt);
      const auto b = representable(random_values(static_cast<std::size_t>(k * n), 52, -0.5f, 0.5f), b_dt);
      DeviceTensor at(be, a_dt, ta ? Shape{k, m} : Shape{m, k}, a);
      DeviceTensor bt(be, b_dt, tb ? Shape{n, k} : Shape{k, n}, b);
      DeviceTensor c32(be, DType::fp32, {m, n});
      sdk::GemmArgs args;
      args.a = {at, ta, a_scale_inv};
      args.b = {bt, tb, b_scale_inv};
      args.c = c32;
      args.compute = a_dt;
      sdk::facet<sdk::GemmFacet>(be)->gemm(args);
      const auto expected = reference(a, ta, b, tb, m, n, k, a_scale_inv, b_scale_inv);
      // Exact products, fp32 accumulation of k terms of magnitude <= 8*0.5*scales.
      const double abs_tol = 4e-6 * static_cast<double>(k) * a_scale_inv * b_scale_inv * 4.0;
      expect_close(c32.get(), expected, 2e-6, abs_tol, "fp32 C");
      // 16-bit C: the fp32 result above rounded once (same primitive, so bit for bit).
      for (DType c_dt : {DType::bf16, DType::fp16}) {
        DeviceTensor c16(be, c_dt, {m, n});
        args.c = c16;
        sdk::facet<sdk::GemmFacet>(be)->gemm(args);
        const auto want = c32.get();
        const auto got = c16.get();
        for (std::size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(got[i], stored_value(want[i], c_dt)) << sdk::dtype_name(c_dt) << " C, element " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    DtypesAndTransposes, backend_cpu_mixed_gemm,
    ::testing::Combine(::testing::Values(DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2),
                       ::testing::Values(DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp32),
                       ::testing::Bool(), ::testing::Bool()),
    [](const ::testing::TestParamInfo<MixedCase>& info) {
      return std::string(sdk::dtype_name(std::get<0>(info.param))) + "_x_" +
             std::string(sdk::dtype_name(std::get<1>(info.param))) +
             (std::get<2>(info.param) ? "_tA" : "_nA") + (std::get<3>(info.param) ? "_tB" : "_nB");
    });

// An fp8 GEMM scales the accumulated products once, as a Tensor Core does: C = fl(acc · s) with
// acc the fp32 sum of the codes' exact products and s = alpha · scale_inv_a · scale_inv_b rounded
// to fp32 once. Decoding each code × a scale_inv that is no power of two (1/3, 1/7) rounded every
// element first, and the products were then not the codes'.
TEST(backend_cpu_mixed_gemm_fp8, TheScalesMultiplyTheAccumulatedCodesOnce) {
  CpuBackend be(1);
  const std::int64_t m = 4, n = 5, k = 3;
  const auto a = representable(random_values(static_cast<std::size_t>(m * k), 61, -40.0f, 40.0f),
                               DType::fp8_e4m3);
  const auto b = representable(random_values(static_cast<std::size_t>(k * n), 62, -12.0f, 12.0f),
                               DType::fp8_e4m3);
  DeviceTensor at(be, DType::fp8_e4m3, {m, k}, a);
  DeviceTensor bt(be, DType::fp8_e4m3, {k, n}, b);
  for (const float alpha : {1.0f, 0.75f}) {
    const float sa = 1.0f / 3.0f, sb = 1.0f / 7.0f;
    DeviceTensor c(be, DType::fp32, {m, n});
    sdk::GemmArgs args;
    args.a = {at, false, sa};
    args.b = {bt, false, sb};
    args.c = c;
    args.alpha = alpha;
    args.compute = DType::fp8_e4m3;
    sdk::facet<sdk::GemmFacet>(be)->gemm(args);
    const float s = static_cast<float>(static_cast<double>(alpha) * sa * sb);
    const auto got = c.get();
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        // Codes of at most 4 significant bits: their products and a sum of three are exact.
        float acc = 0.0f;
        for (std::int64_t p = 0; p < k; ++p)
          acc += a[static_cast<std::size_t>(i * k + p)] * b[static_cast<std::size_t>(p * n + j)];
        EXPECT_EQ(bits_of(got[static_cast<std::size_t>(i * n + j)]), bits_of(acc * s))
            << i << "," << j << " alpha " << alpha;
      }
  }
}

TEST(backend_cpu_mixed_gemm_bf16, OnednnAndEmulatedPathsAgree) {
  CpuBackend emulated(2, Bf16GemmPath::emulated);
  CpuBackend onednn(2, Bf16GemmPath::onednn);
  const auto caps = onednn.capabilities();
  if (!caps.native(DType::bf16)) GTEST_SKIP() << "oneDNN has no bf16 matmul here: " << caps.find(DType::bf16)->how;
  EXPECT_FALSE(emulated.capabilities().native(DType::bf16));
  const std::int64_t m = 96, n = 80, k = 256;
  const auto a = representable(random_values(static_cast<std::size_t>(m * k), 61), DType::bf16);
  const auto b = representable(random_values(static_cast<std::size_t>(n * k), 62), DType::bf16);
  const auto bias = random_values(static_cast<std::size_t>(n), 63);
  const auto c0 = representable(random_values(static_cast<std::size_t>(m * n), 64), DType::bf16);
  std::vector<std::vector<float>> results;
  for (CpuBackend* be : {&emulated, &onednn}) {
    DeviceTensor at(*be, DType::bf16, {m, k}, a);
    DeviceTensor bt(*be, DType::bf16, {n, k}, b);
    DeviceTensor bias_t(*be, DType::fp32, {n}, bias);
    DeviceTensor c(*be, DType::fp32, {m, n}, c0);
    sdk::GemmArgs args;
    args.a = {at, false};
    args.b = {bt, true};
    args.c = c;
    args.alpha = 0.5f;
    args.beta = 1.0f;
    args.bias = bias_t;
    args.compute = DType::bf16;
    sdk::facet<sdk::GemmFacet>(*be)->gemm(args);
    results.push_back(c.get());
  }
  auto expected = reference(a, false, b, true, m, n, k, 1.0, 1.0);
  for (std::size_t i = 0; i < expected.size(); ++i)
    expected[i] = 0.5 * expected[i] + c0[i] + bias[i % static_cast<std::size_t>(n)];
  expect_close(results[0], expected, 2e-6, 1e-6 * k, "emulated bf16");
  expect_close(results[1], expected, 2e-6, 1e-6 * k, "oneDNN bf16");
  std::vector<double> emulated_as_double(results[0].begin(), results[0].end());
  expect_close(results[1], emulated_as_double, 2e-6, 1e-6 * k, "oneDNN vs emulated");
}

TEST(backend_cpu_mixed_gemm_edge, AlphaBetaBiasWith16BitCAreRoundedOnce) {
  CpuBackend be(2);
  const std::int64_t m = 9, n = 11, k = 6;
  const auto a = representable(random_values(static_cast<std::size_t>(m * k), 71), DType::fp16);
  const auto b = representable(random_values(static_cast<std::size_t>(k * n), 72), DType::fp16);
  const auto c0 = representable(random_values(static_cast<std::size_t>(m * n), 73), DType::bf16);
  const auto bias = random_values(static_cast<std::size_t>(n), 74);
  DeviceTensor at(be, DType::fp16, {m, k}, a);
  DeviceTensor bt(be, DType::fp16, {k, n}, b);
  DeviceTensor bias_t(be, DType::fp32, {n}, bias);
  DeviceTensor c16(be, DType::bf16, {m, n}, c0);
  DeviceTensor c32(be, DType::fp32, {m, n}, c0);  // same old values, decoded
  sdk::GemmArgs args;
  args.a = {at, false};
  args.b = {bt, false};
  args.alpha = -1.5f;
  args.beta = 0.75f;
  args.bias = bias_t;
  args.compute = DType::fp16;
  args.c = c32;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  args.c = c16;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  const auto want = c32.get();
  const auto got = c16.get();
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], stored_value(want[i], DType::bf16)) << i;
}

TEST(backend_cpu_mixed_gemm_edge, Fp16OverflowAndSubnormalsBehaveAsTheFormat) {
  // What a Tensor Core sees: fp16 subnormal inputs are exact, an fp16 C overflows to inf.
  CpuBackend be(1);
  DeviceTensor a(be, DType::fp16, {1, 2}, {0x1p-24f, 0x1p-20f});  // fp16 subnormals
  DeviceTensor b(be, DType::fp16, {2, 1}, {1024.0f, 1.0f});
  DeviceTensor c32(be, DType::fp32, {1, 1});
  sdk::GemmArgs args;
  args.a = {a, false};
  args.b = {b, false};
  args.c = c32;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  EXPECT_EQ(c32.get()[0], 0x1p-14f + 0x1p-20f);
  DeviceTensor big_a(be, DType::fp16, {1, 2}, {256.0f, 256.0f});
  DeviceTensor big_b(be, DType::fp16, {2, 1}, {128.0f, 128.0f});  // 65536 > fp16 max
  DeviceTensor c16(be, DType::fp16, {1, 1});
  args.a = {big_a, false};
  args.b = {big_b, false};
  args.c = c16;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  EXPECT_EQ(c16.get()[0], kInf);
}

TEST(backend_cpu_mixed_gemm_edge, Tf32ComputeLeaves16BitOperandsExact) {
  CpuBackend be(1);
  const auto a = representable(random_values(24, 81), DType::bf16);
  const auto b = representable(random_values(24, 82), DType::fp16);
  DeviceTensor at(be, DType::bf16, {4, 6}, a);
  DeviceTensor bt(be, DType::fp16, {6, 4}, b);
  DeviceTensor c1(be, DType::fp32, {4, 4}), c2(be, DType::fp32, {4, 4});
  sdk::GemmArgs args;
  args.a = {at, false};
  args.b = {bt, false};
  args.c = c1;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  args.c = c2;
  args.compute = DType::tf32;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  EXPECT_EQ(c1.get(), c2.get());
}

TEST(backend_cpu_mixed_gemm_memory, ScratchIsReusedAndCountedInBytesNotAllocations) {
  CpuBackend be(2);
  DeviceTensor a(be, DType::fp16, {64, 32}, random_values(2048, 91));
  DeviceTensor b(be, DType::fp16, {32, 16}, random_values(512, 92));
  DeviceTensor c(be, DType::bf16, {64, 16});
  const auto before = be.memory_stats();
  sdk::GemmArgs args;
  args.a = {a, false};
  args.b = {b, false};
  args.c = c;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  const auto after = be.memory_stats();
  EXPECT_EQ(after.allocations, before.allocations);
  // Decoded A and B plus the fp32 C, at least.
  EXPECT_GE(after.current_bytes, before.current_bytes + (2048 + 512 + 1024) * 4);
  EXPECT_GE(after.peak_bytes, after.current_bytes);
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);  // same sizes: nothing grows
  EXPECT_EQ(be.memory_stats().current_bytes, after.current_bytes);
}

// --- casts -------------------------------------------------------------------------------------

// Inputs that exercise every rule: ties, subnormals of each format, overflow of each format,
// inf, NaN, signed zeros.
std::vector<float> awkward_values() {
  std::vector<float> v = {0.0f,    -0.0f,    1.0f,       -2.5f,      0.1f,       1.0f + 0x1p-8f,
                          448.0f,  464.0f,   465.0f,     -500.0f,    57344.0f,   61440.0f,
                          65504.0f, 65520.0f, -1e6f,     3e38f,      0x1p-9f,    0x1p-10f,
                          0x1p-16f, 0x1p-17f, 0x1.8p-24f, 0x1p-25f,  0x1p-130f,  kInf,
                          -kInf,   kNaN,     -kNaN};
  const auto more = random_values(4000, 99, -600.0f, 600.0f);
  v.insert(v.end(), more.begin(), more.end());
  const auto tiny = random_values(1000, 98, -1e-3f, 1e-3f);
  v.insert(v.end(), tiny.begin(), tiny.end());
  return v;
}

// What cast() must produce for one element: decode (exact), x*scale in fp32, encode.
float expected_cast(float stored_src, DType dst, float scale, bool saturate) {
  const sdk::Overflow rule = saturate ? sdk::Overflow::saturate : sdk::Overflow::to_inf_or_nan;
  const float x = scale == 1.0f ? stored_src : stored_src * scale;
  switch (dst) {
    case DType::bf16: return sdk::decode_bf16(sdk::encode_bf16(x, rule));
    case DType::fp16: return sdk::decode_fp16(sdk::encode_fp16(x, rule));
    case DType::fp8_e4m3: return sdk::decode_fp8_e4m3(sdk::encode_fp8_e4m3(x, rule));
    case DType::fp8_e5m2: return sdk::decode_fp8_e5m2(sdk::encode_fp8_e5m2(x, rule));
    case DType::tf32: return sdk::round_to_tf32(x, rule);
    default: {
      constexpr float kMax = std::numeric_limits<float>::max();
      if (saturate && std::isinf(x)) return x > 0 ? kMax : -kMax;
      return x;
    }
  }
}

using CastCase = std::tuple<DType, DType>;
class backend_cpu_cast_pairs : public ::testing::TestWithParam<CastCase> {};

TEST_P(backend_cpu_cast_pairs, EveryPairMatchesTheSdkScalarConversions) {
  const auto [src_dt, dst_dt] = GetParam();
  CpuBackend be(2);
  // fp8 sources can only hold what fp8 holds: the stored source values are what the cast reads.
  const std::vector<float> values = awkward_values();
  DeviceTensor src(be, src_dt, {static_cast<std::int64_t>(values.size())}, values);
  const auto stored = src.get();
  for (const float scale : {1.0f, 0.25f, 96.0f})
    for (const bool saturate : {false, true}) {
      DeviceTensor dst(be, dst_dt, {static_cast<std::int64_t>(values.size())});
      DeviceTensor amax(be, DType::fp32, {1}, {0.0f});
      be.cast(src, dst, {scale, saturate, amax});
      const auto got = dst.get();
      bool any_nan = false;
      double max_abs = 0.0;
      for (std::size_t i = 0; i < stored.size(); ++i) {
        const float want = expected_cast(stored[i], dst_dt, scale, saturate);
        any_nan = any_nan || std::isnan(stored[i]);
        if (!std::isnan(stored[i])) max_abs = std::max(max_abs, std::fabs(static_cast<double>(stored[i])));
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got[i])) << "element " << i << " scale " << scale;
          ASSERT_EQ(std::signbit(got[i]), std::signbit(want)) << "NaN sign, element " << i;
        } else {
          ASSERT_EQ(bits_of(got[i]), bits_of(want))
              << sdk::dtype_name(src_dt) << " -> " << sdk::dtype_name(dst_dt) << " element " << i
              << " src " << stored[i] << " scale " << scale << " saturate " << saturate;
        }
      }
      if (any_nan)
        EXPECT_TRUE(std::isnan(amax.get()[0]));
      else
        EXPECT_EQ(amax.get()[0], static_cast<float>(max_abs));
    }
}

std::string cast_name(const ::testing::TestParamInfo<CastCase>& info) {
  return std::string(sdk::dtype_name(std::get<0>(info.param))) + "_to_" +
         std::string(sdk::dtype_name(std::get<1>(info.param)));
}

constexpr DType kCastDtypes[] = {DType::fp32, DType::tf32, DType::bf16, DType::fp16, DType::fp8_e4m3,
                                 DType::fp8_e5m2};
INSTANTIATE_TEST_SUITE_P(AllPairs, backend_cpu_cast_pairs,
                         ::testing::Combine(::testing::ValuesIn(kCastDtypes),
                                            ::testing::ValuesIn(kCastDtypes)),
                         cast_name);

TEST(backend_cpu_cast_fp8, SaturationAmaxAndLargeParallelTensors) {
  CpuBackend be(2);
  // Large enough for the parallel path; amax over the unscaled source across threads.
  auto values = random_values(200000, 7, -3.0f, 3.0f);
  values[123457] = -1000.0f;
  DeviceTensor src(be, DType::fp32, {200000}, values);
  DeviceTensor e4m3(be, DType::fp8_e4m3, {200000});
  DeviceTensor amax(be, DType::fp32, {1}, {0.0f});
  be.cast(src, e4m3, {100.0f, true, amax});
  EXPECT_EQ(amax.get()[0], 1000.0f);
  EXPECT_EQ(e4m3.get()[123457], -448.0f);  // saturated
  be.cast(src, e4m3, {100.0f, false, {}});
  EXPECT_TRUE(std::isnan(e4m3.get()[123457]));  // e4m3 has no inf
  DeviceTensor e5m2(be, DType::fp8_e5m2, {200000});
  be.cast(src, e5m2, {100.0f, false, {}});
  EXPECT_EQ(e5m2.get()[123457], -kInf);
  const auto got = e5m2.get();
  for (std::size_t i = 0; i < values.size(); i += 997)
    ASSERT_EQ(got[i], expected_cast(values[i], DType::fp8_e5m2, 100.0f, false)) << i;
}

// How many elements (r, c) of `stored` [rows, cols] do not have their bits at (c, r) in
// `transposed`.
std::size_t transposed_mismatches(const std::vector<float>& transposed,
                                  const std::vector<float>& stored, std::int64_t rows,
                                  std::int64_t cols) {
  std::size_t wrong = 0;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      wrong += bits_of(transposed[static_cast<std::size_t>(c * rows + r)]) !=
               bits_of(stored[static_cast<std::size_t>(r * cols + c)]);
  return wrong;
}

// gemm 1.6's cast_transpose, implemented but not offered (cpu_cast_transpose.h): each layout is
// cast()'s codes, the transposed one at (c, r), from tiles spread over two threads on the larger
// shapes; the amax is cast's; bad arguments are refused by the shared checks.
TEST(backend_cpu_cast_transpose, IsTheCastAndItsTransposeAndIsNotOffered) {
  CpuBackend be(2);
  auto* gemm = sdk::facet<sdk::GemmFacet>(be);
  ASSERT_NE(gemm, nullptr);
  EXPECT_FALSE(gemm->supports(sdk::GemmOp::cast_transpose,
                              std::vector<DType>{DType::bf16, DType::fp8_e4m3}));
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{3, 130}, {67, 45}, {300, 257}};
  unsigned seed = 11;
  for (const auto& [rows, cols] : shapes)
    for (DType from : {DType::fp32, DType::bf16, DType::fp16})
      for (DType to : {DType::fp8_e4m3, DType::fp8_e5m2}) {
        SCOPED_TRACE(std::string(sdk::dtype_name(from)) + " -> " +
                     std::string(sdk::dtype_name(to)) + " [" + std::to_string(rows) + ", " +
                     std::to_string(cols) + "]");
        auto values = random_values(static_cast<std::size_t>(rows * cols), seed++, -300.f, 300.f);
        values[5] = 60000.f;  // saturates
        DeviceTensor src(be, from, {rows, cols}, values), want(be, to, {rows, cols});
        DeviceTensor out(be, to, {rows, cols}), out_t(be, to, {cols, rows});
        DeviceTensor a1(be, DType::fp32, {1}, {0.0f}), a2(be, DType::fp32, {1}, {0.0f});
        be.cast(src, want, {2.0f, true, a1});
        sdk::CastTransposeArgs both;
        both.src = src;
        both.out = out;
        both.out_transposed = out_t;
        both.cast = {2.0f, true, a2};
        gemm->cast_transpose(both);
        const auto w = want.get(), o = out.get(), t = out_t.get();
        ASSERT_EQ(o.size(), w.size());
        for (std::size_t i = 0; i < w.size(); ++i) ASSERT_EQ(bits_of(o[i]), bits_of(w[i])) << i;
        EXPECT_EQ(transposed_mismatches(t, w, rows, cols), 0u);
        EXPECT_EQ(a2.get()[0], a1.get()[0]);
      }
  DeviceTensor src(be, DType::bf16, {6, 10}, random_values(60, 3));
  DeviceTensor unswapped(be, DType::fp8_e4m3, {6, 10});
  sdk::CastTransposeArgs none;
  none.src = src;
  EXPECT_THROW(gemm->cast_transpose(none), sdk::BackendError);
  sdk::CastTransposeArgs wrong;
  wrong.src = src;
  wrong.out_transposed = unswapped;
  EXPECT_THROW(gemm->cast_transpose(wrong), sdk::BackendError);
}

// gemm 1.7's cast_transpose_gradient, implemented but not offered: the activation facet's gelu
// gradient rounded into dy's dtype, that gradient's bias_grad (accumulated), and its cast, bit for
// bit; bad arguments are refused by the shared checks before anything is written.
TEST(backend_cpu_cast_transpose, GradientIsTheGeluGradientItsSumsAndItsCastAndIsNotOffered) {
  CpuBackend be(2);
  auto* gemm = sdk::facet<sdk::GemmFacet>(be);
  auto* act = sdk::facet<sdk::ActivationFacet>(be);
  ASSERT_NE(gemm, nullptr);
  ASSERT_NE(act, nullptr);
  EXPECT_FALSE(gemm->supports(sdk::GemmOp::cast_transpose_gradient,
                              std::vector<DType>{DType::bf16, DType::fp8_e5m2}));
  const std::int64_t rows = 67, cols = 45;
  for (DType from : {DType::fp32, DType::bf16})
    for (bool gelu : {false, true}) {
      SCOPED_TRACE(std::string(sdk::dtype_name(from)) + (gelu ? " with gelu" : ""));
      DeviceTensor dy(be, from, {rows, cols}, random_values(rows * cols, 21, -5.f, 5.f));
      DeviceTensor z(be, from, {rows, cols}, random_values(rows * cols, 22, -3.f, 3.f));
      DeviceTensor d(be, from, {rows, cols});
      if (gelu)
        act->activation_backward(sdk::Activation::gelu, z, dy, d);
      else
        be.copy(d, dy);
      DeviceTensor want_sums(be, DType::fp32, {cols}, std::vector<float>(cols, 0.5f));
      act->bias_grad(d, want_sums, true);
      DeviceTensor want(be, DType::fp8_e5m2, {rows, cols});
      DeviceTensor a1(be, DType::fp32, {1}, {0.0f}), a2(be, DType::fp32, {1}, {0.0f});
      be.cast(d, want, {4.0f, true, a1});
      DeviceTensor out_t(be, DType::fp8_e5m2, {cols, rows});
      DeviceTensor sums(be, DType::fp32, {cols}, std::vector<float>(cols, 0.5f));
      sdk::CastTransposeGradientArgs fused;
      fused.cast.src = dy;
      fused.cast.out_transposed = out_t;
      fused.cast.cast = {4.0f, true, a2};
      fused.has_activation_grad = gelu;
      if (gelu) fused.pre_activation = z;
      fused.column_sums = sums;
      fused.accumulate_column_sums = true;
      gemm->cast_transpose_gradient(fused);
      const auto w = want.get(), t = out_t.get();
      EXPECT_EQ(transposed_mismatches(t, w, rows, cols), 0u);
      EXPECT_EQ(a2.get()[0], a1.get()[0]);
      EXPECT_EQ(sums.get(), want_sums.get());
    }
  DeviceTensor dy(be, DType::bf16, {6, 10}, random_values(60, 3));
  DeviceTensor z32(be, DType::fp32, {6, 10}, random_values(60, 4));
  DeviceTensor out_t(be, DType::fp8_e5m2, {10, 6});
  DeviceTensor sums(be, DType::fp32, {9});
  sdk::CastTransposeGradientArgs bad;
  bad.cast.src = dy;
  bad.cast.out_transposed = out_t;
  bad.has_activation_grad = true;
  bad.pre_activation = z32;  // not dy's dtype
  EXPECT_THROW(gemm->cast_transpose_gradient(bad), sdk::BackendError);
  bad.pre_activation = dy;
  bad.activation = sdk::Activation::relu;
  EXPECT_THROW(gemm->cast_transpose_gradient(bad), sdk::BackendError);
  bad.activation = sdk::Activation::gelu;
  bad.column_sums = sums;  // [9] for 10 columns
  EXPECT_THROW(gemm->cast_transpose_gradient(bad), sdk::BackendError);
}

// --- kernels with mixed storage ----------------------------------------------------------------

TEST(backend_cpu_mixed_kernels, ActivationsWithSixteenBitXAndYMatchFp32RoundedOnce) {
  CpuBackend be(2);
  // Small (one thread, portable kernel) and large (parallel / oneDNN) tensors.
  for (const std::int64_t numel : {std::int64_t{300}, std::int64_t{70000}}) {
    const auto xv = representable(random_values(static_cast<std::size_t>(numel), 101, -3.0f, 3.0f), DType::bf16);
    const auto gv = representable(random_values(static_cast<std::size_t>(numel), 102), DType::bf16);
    DeviceTensor x32(be, DType::fp32, {numel}, xv), g32(be, DType::fp32, {numel}, gv);
    DeviceTensor y32(be, DType::fp32, {numel}), dx32(be, DType::fp32, {numel});
    sdk::facet<sdk::ActivationFacet>(be)->activation_forward(sdk::Activation::relu, x32, y32);
    sdk::facet<sdk::ActivationFacet>(be)->activation_backward(sdk::Activation::relu, x32, g32,
                                                              dx32);
    const auto y_ref = y32.get();
    const auto dx_ref = dx32.get();
    for (const auto& [xd, yd] : {std::pair{DType::bf16, DType::bf16}, std::pair{DType::bf16, DType::fp32},
                                 std::pair{DType::fp32, DType::fp16}, std::pair{DType::bf16, DType::fp16}}) {
      DeviceTensor x(be, xd, {numel}, xv), y(be, yd, {numel});
      sdk::facet<sdk::ActivationFacet>(be)->activation_forward(sdk::Activation::relu, x, y);
      const auto got = y.get();
      for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], stored_value(y_ref[i], yd)) << i;
      DeviceTensor g(be, xd, {numel}, gv), dx(be, yd, {numel});
      sdk::facet<sdk::ActivationFacet>(be)->activation_backward(sdk::Activation::relu, x, g, dx);
      const auto dgot = dx.get();
      for (std::size_t i = 0; i < dgot.size(); ++i) ASSERT_EQ(dgot[i], stored_value(dx_ref[i], yd)) << i;
    }
    // In place on bf16, x == y.
    DeviceTensor xy(be, DType::bf16, {numel}, xv);
    sdk::facet<sdk::ActivationFacet>(be)->activation_forward(sdk::Activation::relu, xy, xy);
    EXPECT_EQ(xy.get(), y_ref);
  }
}

// GELU's gradient over mixed storages (a bf16 activation whose gradient is an FP32 sum, as where
// LoRA's adapter and its base read one tensor): the FP32 op on the decoded values, rounded once
// into dx's dtype, over sizes inside one decode block and across several with a tail.
TEST(backend_cpu_mixed_kernels, GeluGradientOverMixedStoragesIsTheFp32OpRoundedOnce) {
  CpuBackend be(2);
  auto* act = sdk::facet<sdk::ActivationFacet>(be);
  const std::int64_t block = EltwiseEngine::kMixedBlock;
  for (const std::int64_t numel : {std::int64_t{300}, 2 * block + 37}) {
    for (const auto& [xd, gd, dd] : {std::tuple{DType::bf16, DType::fp32, DType::bf16},
                                     std::tuple{DType::bf16, DType::fp32, DType::fp32},
                                     std::tuple{DType::fp32, DType::bf16, DType::bf16},
                                     std::tuple{DType::fp16, DType::fp32, DType::fp16},
                                     std::tuple{DType::bf16, DType::bf16, DType::fp32}}) {
      SCOPED_TRACE(std::string(sdk::dtype_name(xd)) + " x, " + std::string(sdk::dtype_name(gd)) +
                   " dy, " + std::string(sdk::dtype_name(dd)) + " dx, " + std::to_string(numel));
      const auto xv =
          representable(random_values(static_cast<std::size_t>(numel), 111, -4.0f, 4.0f), xd);
      const auto gv = representable(random_values(static_cast<std::size_t>(numel), 112), gd);
      DeviceTensor x32(be, DType::fp32, {numel}, xv), g32(be, DType::fp32, {numel}, gv);
      DeviceTensor dx32(be, DType::fp32, {numel});
      act->activation_backward(sdk::Activation::gelu, x32, g32, dx32);
      const auto want = dx32.get();
      DeviceTensor x(be, xd, {numel}, xv), g(be, gd, {numel}, gv), dx(be, dd, {numel});
      act->activation_backward(sdk::Activation::gelu, x, g, dx);
      const auto got = dx.get();
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], stored_value(want[i], dd)) << i;
    }
  }
  // In place: dx over dy (both fp32) with a bf16 x.
  const auto xv = representable(random_values(1000, 113, -4.0f, 4.0f), DType::bf16);
  const auto gv = random_values(1000, 114);
  DeviceTensor x32(be, DType::fp32, {1000}, xv), g32(be, DType::fp32, {1000}, gv),
      want(be, DType::fp32, {1000});
  act->activation_backward(sdk::Activation::gelu, x32, g32, want);
  DeviceTensor x(be, DType::bf16, {1000}, xv), g(be, DType::fp32, {1000}, gv);
  act->activation_backward(sdk::Activation::gelu, x, g, g);
  EXPECT_EQ(g.get(), want.get());
}

TEST(backend_cpu_mixed_kernels, SoftmaxCrossEntropyReadsHalfLogitsAndWritesHalfGradients) {
  CpuBackend be(2);
  const std::int64_t rows = 6, classes = 7;
  // Multiples of 1/64 in [-4, 4]: exact in bf16 and fp16 alike.
  std::vector<float> zv(static_cast<std::size_t>(rows * classes));
  for (std::size_t i = 0; i < zv.size(); ++i)
    zv[i] = static_cast<float>(static_cast<int>((i * 37) % 513) - 256) / 64.0f;
  DeviceTensor lab(be, DType::int32, {rows}, {0, 6, 3, 3, 1, 2});
  DeviceTensor z32(be, DType::fp32, {rows, classes}, zv), d32(be, DType::fp32, {rows, classes});
  DeviceTensor loss32(be, DType::fp32, {1}), loss16(be, DType::fp32, {1});
  sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(z32, lab, 1024.0f, 0.0f, loss32, {}, d32);
  const auto d_ref = d32.get();
  for (DType logits_dt : {DType::bf16, DType::fp16}) {
    for (DType grad_dt : {DType::bf16, DType::fp16}) {
      DeviceTensor z(be, logits_dt, {rows, classes}, zv), d(be, grad_dt, {rows, classes});
      sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(z, lab, 1024.0f, 0.0f, loss16, {}, d);
      EXPECT_EQ(loss16.get()[0], loss32.get()[0]);
      const auto got = d.get();
      for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], stored_value(d_ref[i], grad_dt)) << i;
    }
  }
}

TEST(backend_cpu_mixed_kernels, SmallAndLargeTensorsGiveTheSameNumbers) {
  // The single-thread threshold must not change results: a row-wise kernel on 4 rows (one
  // thread) equals the same rows inside a 4096-row tensor (parallel).
  CpuBackend be(2);
  const std::int64_t n = 64;
  const auto big = random_values(static_cast<std::size_t>(4096 * n), 121, -2.0f, 2.0f);
  const std::vector<float> small(big.begin(), big.begin() + 4 * n);
  DeviceTensor xs(be, DType::fp32, {4, n}, small), xb(be, DType::fp32, {4096, n}, big);
  DeviceTensor ys(be, DType::bf16, {4, n}), yb(be, DType::bf16, {4096, n});
  DeviceTensor ms(be, DType::fp32, {4}), rs(be, DType::fp32, {4});
  DeviceTensor mb(be, DType::fp32, {4096}), rb(be, DType::fp32, {4096});
  sdk::facet<sdk::LayerNormFacet>(be)->layernorm_forward(xs, {}, {}, 1e-5f, ys, ms, rs);
  sdk::facet<sdk::LayerNormFacet>(be)->layernorm_forward(xb, {}, {}, 1e-5f, yb, mb, rb);
  const auto a = ys.get();
  const auto b = yb.get();
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << i;
}

TEST(backend_cpu_mixed_optimizers, Fp16WorkingCopyIsTheMasterRoundedOnce) {
  CpuBackend be(2);
  const std::int64_t n = 100000;  // several pieces, parallel
  const auto p0 = random_values(static_cast<std::size_t>(n), 131, -70000.0f, 70000.0f);  // some overflow fp16
  DeviceTensor master(be, DType::fp32, {n}, p0), grad(be, DType::fp32, {n}, random_values(static_cast<std::size_t>(n), 132));
  DeviceTensor m(be, DType::fp32, {n}), v(be, DType::fp32, {n});
  for (DType wd : {DType::fp16, DType::bf16}) {
    DeviceTensor working(be, wd, {n});
    const sdk::ParamTensors params[] = {{master, grad, working, m, v}};
    sdk::AdamWHyper h;
    sdk::facet<sdk::OptimizerFacet>(be)->adamw_update(h, params);
    const auto mv = master.get();
    const auto wv = working.get();
    for (std::size_t i = 0; i < mv.size(); ++i) ASSERT_EQ(wv[i], stored_value(mv[i], wd)) << i;
    sdk::SgdHyper s;
    s.momentum = 0.0f;
    sdk::facet<sdk::OptimizerFacet>(be)->sgd_update(s, params);
    const auto mv2 = master.get();
    const auto wv2 = working.get();
    for (std::size_t i = 0; i < mv2.size(); ++i) ASSERT_EQ(wv2[i], stored_value(mv2[i], wd)) << i;
  }
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing

namespace mixtrain::backend_cpu::testing {
namespace {

TEST(backend_cpu_gemm_threads, ShapesAroundTheSingleThreadBoundaryMatchTheReference) {
  // 2048x32x32 and 32x32x2048 are exactly 2^21 multiply-adds (one thread); 2048x32x33 is above.
  CpuBackend be(2);
  for (const auto& [m, n, k] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{2048, 32, 32},
                                {32, 32, 2048},
                                {2048, 32, 33},
                                {2048, 10, 32}})
    for (const bool ta : {false, true})
      for (const bool tb : {false, true})
        for (const float beta : {0.0f, 1.0f}) {
          const auto a = random_values(static_cast<std::size_t>(m * k), 141);
          const auto b = random_values(static_cast<std::size_t>(k * n), 142);
          const auto c0 = random_values(static_cast<std::size_t>(m * n), 143);
          const auto bias = random_values(static_cast<std::size_t>(n), 144);
          DeviceTensor at(be, DType::fp32, ta ? Shape{k, m} : Shape{m, k}, a);
          DeviceTensor bt(be, DType::fp32, tb ? Shape{n, k} : Shape{k, n}, b);
          DeviceTensor c(be, DType::fp32, {m, n}, c0);
          DeviceTensor bias_t(be, DType::fp32, {n}, bias);
          sdk::GemmArgs args;
          args.a = {at, ta};
          args.b = {bt, tb};
          args.c = c;
          args.beta = beta;
          args.bias = bias_t;
          for (int call = 0; call < 2; ++call) {
            c.set(c0);
            sdk::facet<sdk::GemmFacet>(be)->gemm(args);
            auto expected = reference(a, ta, b, tb, m, n, k, 1.0, 1.0);
            for (std::size_t i = 0; i < expected.size(); ++i)
              expected[i] += beta * c0[i] + bias[i % static_cast<std::size_t>(n)];
            expect_close(c.get(), expected, 1e-5, 1e-5 * static_cast<double>(k), "C");
          }
        }
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
