// gemm() against a double-precision reference: odd shapes, all transpose combinations, alpha,
// beta, bias, 16-bit C, tf32 emulation, and the errors for unsupported dtypes / shapes.
#include <tuple>

#include "backend_test_util.h"
#include "mixtrain/sdk/backend_scratch.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cpu::testing {
namespace {

// op(A)[m,k] from A stored [m,k] (or [k,m] when transposed), likewise B.
std::vector<double> reference_gemm(const std::vector<float>& a, bool ta, const std::vector<float>& b,
                                   bool tb, std::vector<float> c, const std::vector<float>& bias,
                                   std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
                                   double beta) {
  std::vector<double> out(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double av = ta ? a[static_cast<std::size_t>(p * m + i)] : a[static_cast<std::size_t>(i * k + p)];
        const double bv = tb ? b[static_cast<std::size_t>(j * k + p)] : b[static_cast<std::size_t>(p * n + j)];
        acc += av * bv;
      }
      const auto idx = static_cast<std::size_t>(i * n + j);
      out[idx] = alpha * acc + beta * c[idx] + (bias.empty() ? 0.0 : bias[static_cast<std::size_t>(j)]);
    }
  return out;
}

using GemmCase = std::tuple<bool, bool, bool, float, float>;  // ta, tb, bias, alpha, beta

class backend_cpu_gemm : public ::testing::TestWithParam<GemmCase> {};

TEST_P(backend_cpu_gemm, MatchesDoubleReferenceOnOddShapes) {
  const auto [ta, tb, with_bias, alpha, beta] = GetParam();
  CpuBackend be(2);
  for (const auto& [m, n, k] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{7, 13, 5},
                                {13, 7, 11},
                                {1, 1, 1},
                                {67, 45, 129}}) {
    const auto a = random_values(static_cast<std::size_t>(m * k), 1);
    const auto b = random_values(static_cast<std::size_t>(k * n), 2);
    const auto c0 = random_values(static_cast<std::size_t>(m * n), 3);
    const auto bias = with_bias ? random_values(static_cast<std::size_t>(n), 4) : std::vector<float>{};
    DeviceTensor ta_t(be, DType::fp32, ta ? Shape{k, m} : Shape{m, k}, a);
    DeviceTensor tb_t(be, DType::fp32, tb ? Shape{n, k} : Shape{k, n}, b);
    DeviceTensor c(be, DType::fp32, {m, n}, c0);
    DeviceTensor bias_t(be, DType::fp32, {n}, with_bias ? bias : std::vector<float>(static_cast<std::size_t>(n)));
    sdk::GemmArgs args;
    args.a = {ta_t, ta};
    args.b = {tb_t, tb};
    args.c = c;
    args.alpha = alpha;
    args.beta = beta;
    if (with_bias) args.bias = bias_t;
    sdk::facet<sdk::GemmFacet>(be)->gemm(args);
    const auto expected = reference_gemm(a, ta, b, tb, c0, bias, m, n, k, alpha, beta);
    expect_close(c.get(), expected, 1e-5, 1e-5 * static_cast<double>(k), "C");
    // The cached primitive is reused on the second call with the same key.
    c.set(c0);
    sdk::facet<sdk::GemmFacet>(be)->gemm(args);
    expect_close(c.get(), expected, 1e-5, 1e-5 * static_cast<double>(k), "C (cached)");
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, backend_cpu_gemm,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(1.0f, -0.5f),
                                            ::testing::Values(0.0f, 1.0f, 0.75f)));

TEST(backend_cpu_gemm_output, Bf16AndFp16OutputsAreRoundedResults) {
  CpuBackend be(2);
  const std::int64_t m = 9, n = 11, k = 6;
  const auto a = random_values(static_cast<std::size_t>(m * k), 5);
  const auto b = random_values(static_cast<std::size_t>(n * k), 6);
  const auto bias = random_values(static_cast<std::size_t>(n), 7);
  for (DType out : {DType::bf16, DType::fp16}) {
    const auto c0 = representable(random_values(static_cast<std::size_t>(m * n), 8), out);
    DeviceTensor at(be, DType::fp32, {m, k}, a);
    DeviceTensor bt(be, DType::fp32, {n, k}, b);
    DeviceTensor c(be, out, {m, n}, c0);
    DeviceTensor bias_t(be, DType::fp32, {n}, bias);
    sdk::GemmArgs args;
    args.a = {at, false};
    args.b = {bt, true};
    args.c = c;
    args.beta = 0.5f;
    args.bias = bias_t;
    sdk::facet<sdk::GemmFacet>(be)->gemm(args);
    const auto expected = reference_gemm(a, false, b, true, c0, bias, m, n, k, 1.0, 0.5);
    const double ulp = out == DType::bf16 ? 0x1p-8 : 0x1p-11;
    expect_close(c.get(), expected, ulp, 1e-5, "16-bit C");
  }
}

// A bf16 C of bf16 operands: on the native route (oneDNN's bf16 matmul) oneDNN writes C itself,
// with no fp32 scratch for it, each element within the FP32 sum's bound of the exact
// alpha·Σ a·b + beta·c0 + bias plus one rounding, the same bits on one and two threads; on the
// emulated route C is the fp32 result rounded once through scratch, within the same bound. At
// k = 3072 (GPT-2 small's c_proj), where oneDNN's order for a bf16 destination differs from its
// fp32 one's.
TEST(backend_cpu_gemm_output, NativeBf16OutputIsWrittenByTheMatmulWithinTheSumBound) {
  const std::int64_t m = 48, n = 40, k = 3072;
  const auto a = representable(random_values(static_cast<std::size_t>(m * k), 11), DType::bf16);
  const auto b = representable(random_values(static_cast<std::size_t>(n * k), 12), DType::bf16);
  const auto bias = random_values(static_cast<std::size_t>(n), 13);
  const auto c0 = representable(random_values(static_cast<std::size_t>(m * n), 14), DType::bf16);
  for (const Bf16GemmPath path : {Bf16GemmPath::automatic, Bf16GemmPath::emulated})
    for (const float beta : {0.0f, 1.0f}) {
      const auto run = [&](int threads, std::size_t* grew) {
        CpuBackend be(threads, path);
        DeviceTensor at(be, DType::bf16, {m, k}, a), bt(be, DType::bf16, {n, k}, b);
        DeviceTensor c(be, DType::bf16, {m, n}, c0), bias_t(be, DType::fp32, {n}, bias);
        sdk::GemmArgs args;
        args.a = {at, false};
        args.b = {bt, true};
        args.c = c;
        args.beta = beta;
        args.bias = bias_t;
        const std::size_t before = sdk::facet<sdk::ScratchFacet>(be)->scratch_bytes();
        sdk::facet<sdk::GemmFacet>(be)->gemm(args);
        *grew = sdk::facet<sdk::ScratchFacet>(be)->scratch_bytes() - before;
        return std::pair{c.get(), be.bf16_gemm_native()};
      };
      std::size_t grew = 0, grew_one = 0;
      const auto [got, native] = run(2, &grew);
      SCOPED_TRACE(std::string(native ? "native" : "emulated") + ", beta " + std::to_string(beta));
      EXPECT_EQ(run(1, &grew_one).first, got);
      // Native: no scratch at all (operands read as stored, C written by the matmul); emulated:
      // the decoded operands and the fp32 C.
      if (native)
        EXPECT_EQ(grew, 0u);
      else
        EXPECT_GE(grew, static_cast<std::size_t>(m * n) * 4);
      const double u = 0x1p-24, gamma = (k + 2) * u / (1.0 - (k + 2) * u);
      int bad = 0;
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          double exact = 0.0, magnitude = 0.0;
          for (std::int64_t p = 0; p < k; ++p) {
            const double t = double{a[static_cast<std::size_t>(i * k + p)]} *
                             b[static_cast<std::size_t>(j * k + p)];
            exact += t;
            magnitude += std::abs(t);
          }
          const auto e = static_cast<std::size_t>(i * n + j);
          const double base = beta * c0[e] + bias[static_cast<std::size_t>(j)];
          const double want = exact + base;
          const double bound =
              gamma * (magnitude + std::abs(base)) + 0x1p-8 * (std::abs(want) + gamma * magnitude);
          if (std::abs(got[e] - want) > bound && ++bad <= 3)
            ADD_FAILURE() << "C[" << e << "] = " << got[e] << ", exact " << want << ", bound "
                          << bound;
        }
    }
}

TEST(backend_cpu_gemm_tf32, RoundsInputsToTenMantissaBits) {
  CpuBackend be(2);
  const std::int64_t m = 5, n = 3, k = 4;
  // Inputs with bits below tf32 precision: 1 + 2^-12 rounds to 1 in tf32.
  std::vector<float> a(static_cast<std::size_t>(m * k), 1.0f + 0x1p-12f);
  std::vector<float> b = random_values(static_cast<std::size_t>(k * n), 9);
  for (std::size_t i = 0; i < a.size(); i += 3) a[i] = 1.0f + 3 * 0x1p-11f;  // tie -> 1 + 2^-9
  DeviceTensor at(be, DType::fp32, {m, k}, a);
  DeviceTensor bt(be, DType::fp32, {k, n}, b);
  DeviceTensor c(be, DType::fp32, {m, n});
  sdk::GemmArgs args;
  args.a = {at, false};
  args.b = {bt, false};
  args.c = c;
  args.compute = DType::tf32;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  std::vector<float> ar(a), br(b);
  for (auto& x : ar) x = round_to_tf32(x);
  for (auto& x : br) x = round_to_tf32(x);
  const auto zeros = std::vector<float>(static_cast<std::size_t>(m * n));
  const auto expected = reference_gemm(ar, false, br, false, zeros, {}, m, n, k, 1.0, 0.0);
  const auto unrounded = reference_gemm(a, false, b, false, zeros, {}, m, n, k, 1.0, 0.0);
  const auto got = c.get();
  expect_close(got, expected, 1e-6, 1e-6, "tf32 C");
  double max_diff = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, std::fabs(got[i] - unrounded[i]));
  EXPECT_GT(max_diff, 1e-4) << "tf32 must differ from the fp32 result on these inputs";
  // The input tensors are not modified (rounding happens in scratch).
  EXPECT_EQ(at.get(), a);
  // An fp32 view flagged as tf32 asks for the same rounding.
  DeviceTensor c2(be, DType::fp32, {m, n});
  sdk::GemmArgs flagged = args;
  flagged.compute = DType::fp32;
  flagged.a.view.dtype = DType::tf32;
  flagged.c = c2;
  sdk::facet<sdk::GemmFacet>(be)->gemm(flagged);
  EXPECT_EQ(c2.get(), got);
}

TEST(backend_cpu_gemm_errors, UnsupportedDtypesAndShapesRaiseBackendError) {
  CpuBackend be(1);
  DeviceTensor labels(be, DType::int32, {4, 4});
  DeviceTensor a(be, DType::fp32, {4, 4});
  DeviceTensor b(be, DType::fp32, {5, 4});
  DeviceTensor c(be, DType::fp32, {4, 4});
  sdk::GemmArgs args;
  args.a = {labels, false};
  args.b = {a, false};
  args.c = c;
  try {
    sdk::facet<sdk::GemmFacet>(be)->gemm(args);
    FAIL() << "int32 inputs must be rejected";
  } catch (const sdk::BackendError& e) {
    for (const char* listed : {"fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"})
      EXPECT_NE(std::string(e.what()).find(listed), std::string::npos) << e.what();
  }
  args.a = {a, false};
  args.c = labels;  // int32 C
  EXPECT_THROW(sdk::facet<sdk::GemmFacet>(be)->gemm(args), sdk::BackendError);
  args.c = c;
  args.a = {a, false};
  args.b = {b, false};  // k mismatch: 4 vs 5
  EXPECT_THROW(sdk::facet<sdk::GemmFacet>(be)->gemm(args), sdk::BackendError);
  args.b = {b, true};  // op(B) = [4, 5] but C is [4, 4]
  EXPECT_THROW(sdk::facet<sdk::GemmFacet>(be)->gemm(args), sdk::BackendError);
}

TEST(backend_cpu_gemm_cache, OnePrimitivePerKeyReusedAcrossCalls) {
  CpuBackend be(2);
  DeviceTensor a(be, DType::fp32, {8, 16}, random_values(128, 41));
  DeviceTensor b(be, DType::fp32, {16, 4}, random_values(64, 42));
  DeviceTensor c(be, DType::fp32, {8, 4});
  DeviceTensor a2(be, DType::fp32, {8, 16}, random_values(128, 43));
  sdk::GemmArgs args;
  args.a = {a, false};
  args.b = {b, false};
  args.c = c;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  args.a = {a2, false};  // other data, same key
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  EXPECT_EQ(be.cached_gemm_primitives(), 1u);
  // alpha is a constant output scale keyed by its value (oneDNN's brgemm kernels take no
  // run-time one), as beta is baked into the sum post-op.
  args.alpha = 3.0f;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  args.alpha = 5.0f;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  EXPECT_EQ(be.cached_gemm_primitives(), 3u);
  args.alpha = 3.0f;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  args.alpha = 5.0f;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  EXPECT_EQ(be.cached_gemm_primitives(), 3u) << "each alpha's primitive is reused";
  args.beta = 0.5f;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  EXPECT_EQ(be.cached_gemm_primitives(), 4u);
  const auto expected = reference_gemm(random_values(128, 43), false, random_values(64, 42), false,
                                       std::vector<float>(32), {}, 8, 4, 16, 5.0, 0.0);
  std::vector<double> with_beta(expected);
  for (std::size_t i = 0; i < with_beta.size(); ++i) with_beta[i] = expected[i] + 0.5 * expected[i];
  expect_close(c.get(), with_beta, 1e-5, 1e-5, "alpha=5, beta=0.5 after alpha=5");
  // With an fp8 operand its scale_inv joins alpha, which delayed scaling changes every step: one
  // run-time scale for every value.
  DeviceTensor a8(be, DType::fp8_e4m3, {8, 16}, random_values(128, 44));
  sdk::GemmArgs fp8;
  fp8.b = {b, false};
  fp8.c = c;
  for (const float scale_inv : {0.5f, 0.25f, 0.125f}) {
    fp8.a = {a8, false, scale_inv};
    sdk::facet<sdk::GemmFacet>(be)->gemm(fp8);
  }
  EXPECT_EQ(be.cached_gemm_primitives(), 5u);
}

TEST(backend_cpu_gemm_edge, LeadingDimensionsOfRank3ViewsAreFolded) {
  CpuBackend be(2);
  const auto a = random_values(2 * 3 * 5, 21);
  const auto b = random_values(4 * 5, 22);
  DeviceTensor at(be, DType::fp32, {2, 3, 5}, a);  // folded to [6, 5]
  DeviceTensor bt(be, DType::fp32, {4, 5}, b);
  DeviceTensor c(be, DType::fp32, {2, 3, 4});
  sdk::GemmArgs args;
  args.a = {at, false};
  args.b = {bt, true};
  args.c = c;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  const auto expected =
      reference_gemm(a, false, b, true, std::vector<float>(24), {}, 6, 4, 5, 1.0, 0.0);
  expect_close(c.get(), expected, 1e-6, 1e-6, "rank-3 C");
}

TEST(backend_cpu_gemm_edge, EmptyInnerDimensionGivesBetaCPlusBias) {
  CpuBackend be(1);
  DeviceTensor a(be, DType::fp32, {3, 0});
  DeviceTensor b(be, DType::fp32, {0, 2});
  DeviceTensor c(be, DType::fp32, {3, 2}, {1, 2, 3, 4, 5, 6});
  DeviceTensor bias(be, DType::fp32, {2}, {10, 20});
  sdk::GemmArgs args;
  args.a = {a, false};
  args.b = {b, false};
  args.c = c;
  args.beta = 2.0f;
  args.bias = bias;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  EXPECT_EQ(c.get(), (std::vector<float>{12, 24, 16, 28, 20, 32}));
}

// The activation epilogue is defined as: z in fp32, pre_activation = round(z), C = round(act(z)).
// The reference is the unfused sequence on the same backend with an fp32 C, so the check is
// bit for bit: GEMM to fp32, activation_forward in fp32, one cast per output.
// The second shape, 600 x 500, runs the epilogue in a whole block of 2^18 elements and a partial
// one (cpu_gemm.cpp's kActivationBlock).
void fused_activation_matches_the_unfused_ops(std::int64_t m, std::int64_t n, std::int64_t k,
                                              const std::vector<DType>& outs,
                                              const std::vector<float>& betas) {
  CpuBackend be(2);
  const auto a = random_values(static_cast<std::size_t>(m * k), 21);
  const auto b = random_values(static_cast<std::size_t>(n * k), 22);
  const auto bias = random_values(static_cast<std::size_t>(n), 23);
  const auto c0 = representable(random_values(static_cast<std::size_t>(m * n), 24), DType::bf16);
  for (sdk::Activation act : {sdk::Activation::relu, sdk::Activation::gelu})
    for (DType out : outs)
      for (float beta : betas) {
        SCOPED_TRACE(std::string(act == sdk::Activation::relu ? "relu" : "gelu") + " C " +
                     std::string(sdk::dtype_name(out)) + " beta " + std::to_string(beta) + ", " +
                     std::to_string(m) + " x " + std::to_string(n));
        DeviceTensor at(be, DType::fp32, {m, k}, a);
        DeviceTensor bt(be, DType::fp32, {n, k}, b);
        DeviceTensor bias_t(be, DType::fp32, {n}, bias);
        // Unfused reference: z in fp32, then the activation in fp32, then one rounding each.
        DeviceTensor z(be, DType::fp32, {m, n}, c0);
        sdk::GemmArgs ref;
        ref.a = {at, false};
        ref.b = {bt, true};
        ref.c = z;
        ref.alpha = 0.75f;
        ref.beta = beta;
        ref.bias = bias_t;
        sdk::facet<sdk::GemmFacet>(be)->gemm(ref);
        DeviceTensor y(be, DType::fp32, {m, n});
        sdk::facet<sdk::ActivationFacet>(be)->activation_forward(act, z, y);
        DeviceTensor want_c(be, out, {m, n});
        DeviceTensor want_pre(be, out, {m, n});
        be.cast(y, want_c);
        be.cast(z, want_pre);

        DeviceTensor c(be, out, {m, n}, c0);
        DeviceTensor pre(be, out, {m, n});
        sdk::GemmArgs fused = ref;
        fused.c = c;
        fused.has_activation = true;
        fused.activation = act;
        fused.pre_activation = pre;
        sdk::facet<sdk::GemmFacet>(be)->gemm(fused);
        EXPECT_EQ(c.get(), want_c.get());
        EXPECT_EQ(pre.get(), want_pre.get());

        // Without pre_activation the output is the same.
        DeviceTensor c2(be, out, {m, n}, c0);
        fused.c = c2;
        fused.pre_activation = {};
        sdk::facet<sdk::GemmFacet>(be)->gemm(fused);
        EXPECT_EQ(c2.get(), want_c.get());
      }
}

TEST(backend_cpu_gemm_epilogue, FusedActivationRoundsOnceAndKeepsThePreActivation) {
  fused_activation_matches_the_unfused_ops(13, 24, 17, {DType::fp32, DType::bf16, DType::fp16},
                                           {0.0f, 0.5f});
  fused_activation_matches_the_unfused_ops(600, 500, 8, {DType::bf16}, {0.5f});
}

TEST(backend_cpu_gemm_epilogue, SixteenBitOutputRoundsOnceNotTwice) {
  // z chosen so that rounding z to bf16 first and then applying gelu differs from rounding
  // gelu(z) once: the fused path must give the latter.
  CpuBackend be(1);
  const std::int64_t m = 64, n = 64, k = 32;
  const auto a = random_values(static_cast<std::size_t>(m * k), 31);
  const auto b = random_values(static_cast<std::size_t>(n * k), 32);
  DeviceTensor at(be, DType::fp32, {m, k}, a);
  DeviceTensor bt(be, DType::fp32, {k, n}, b);
  DeviceTensor fused_c(be, DType::bf16, {m, n});
  DeviceTensor twice_z(be, DType::bf16, {m, n});
  DeviceTensor twice_c(be, DType::bf16, {m, n});
  sdk::GemmArgs g;
  g.a = {at, false};
  g.b = {bt, false};
  g.c = twice_z;
  sdk::facet<sdk::GemmFacet>(be)->gemm(g);
  sdk::facet<sdk::ActivationFacet>(be)->activation_forward(sdk::Activation::gelu, twice_z, twice_c);
  g.c = fused_c;
  g.has_activation = true;
  g.activation = sdk::Activation::gelu;
  sdk::facet<sdk::GemmFacet>(be)->gemm(g);
  const auto f = fused_c.get(), t = twice_c.get(), z = twice_z.get();
  std::size_t differ = 0;
  for (std::size_t i = 0; i < f.size(); ++i) {
    differ += f[i] != t[i];
    // ...but only by the extra rounding: half a bf16 step of z carried through gelu (|gelu'| <
    // 1.13) plus a bf16 step of the output.
    EXPECT_LE(std::abs(f[i] - t[i]), 0x1p-8f * (std::abs(t[i]) + 1.13f * std::abs(z[i]))) << i;
  }
  EXPECT_GT(differ, 0u) << "the fused gelu should round once, so some outputs differ from the "
                           "twice-rounded unfused ones";
}

// gemm_gradient (gemm facet 1.5) is the unfused ops' arithmetic in one call: the same GEMM
// primitive's FP32 product, the activation facet's gelu gradient on it (of z's decoded values),
// one rounding into C, and the activation facet's own column sums. So it equals, bit for bit, the
// unfused ops run in FP32 and the result cast once. 40 x 19 elements is under one epilogue block;
// the bench's shapes and the graph tests run several.
TEST(backend_cpu_gemm_gradient, DgradWithGeluGradientIsTheUnfusedOpsRoundedOnce) {
  CpuBackend be(2);
  auto& gemm = *sdk::facet<sdk::GemmFacet>(be);
  auto& act = *sdk::facet<sdk::ActivationFacet>(be);
  const std::int64_t m = 19, n = 40, k = 33;
  const auto dy = random_values(static_cast<std::size_t>(m * k), 61);
  const auto w = random_values(static_cast<std::size_t>(k * n), 62);
  auto z = random_values(static_cast<std::size_t>(m * n), 63);
  for (float& v : z) v *= 3.0f;
  const auto sums0 = random_values(static_cast<std::size_t>(n), 64);
  for (DType dt : {DType::fp32, DType::bf16, DType::fp16})
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(std::string(sdk::dtype_name(dt)) + (accumulate ? " accumulate" : ""));
      DeviceTensor dy_t(be, dt, {m, k}, dy);
      DeviceTensor w_t(be, dt, {k, n}, w);
      DeviceTensor z_t(be, dt, {m, n}, z);
      // Unfused, with one rounding: FP32 product, gelu's gradient in place, cast, column sums.
      DeviceTensor dh(be, DType::fp32, {m, n});
      sdk::GemmArgs g;
      g.a = {dy_t, false};
      g.b = {w_t, false};
      g.c = dh;
      g.alpha = 0.75f;
      g.compute = dt;
      gemm.gemm(g);
      DeviceTensor z32(be, DType::fp32, {m, n});  // z's values: the epilogue decodes them
      be.cast(z_t, z32);
      act.activation_backward(sdk::Activation::gelu, z32, dh, dh);
      DeviceTensor want(be, dt, {m, n});
      be.cast(dh, want);
      DeviceTensor want_sums(be, DType::fp32, {n}, sums0);
      act.bias_grad(want, want_sums, accumulate);

      DeviceTensor dz(be, dt, {m, n});
      DeviceTensor sums(be, DType::fp32, {n}, sums0);
      sdk::GemmGradientArgs gg;
      gg.gemm = g;
      gg.gemm.c = dz;
      gg.has_activation_grad = true;
      gg.pre_activation = z_t;
      gg.c_column_sums = sums;
      gg.accumulate_c_column_sums = accumulate;
      gemm.gemm_gradient(gg);
      EXPECT_EQ(dz.get(), want.get());
      EXPECT_EQ(sums.get(), want_sums.get());
    }
}

TEST(backend_cpu_gemm_gradient, EpilogueBlocksGiveTheWholeTensorsNumbers) {
  // 1100 x 1000 elements: a whole epilogue block and a partial one (kEpilogueBlock = 2^20).
  CpuBackend be(2);
  const std::int64_t m = 1100, n = 1000, k = 8;
  DeviceTensor dy(be, DType::bf16, {m, k}, random_values(static_cast<std::size_t>(m * k), 91));
  DeviceTensor w(be, DType::bf16, {k, n}, random_values(static_cast<std::size_t>(k * n), 92));
  DeviceTensor z(be, DType::bf16, {m, n}, random_values(static_cast<std::size_t>(m * n), 93));
  DeviceTensor z32(be, DType::fp32, {m, n});
  be.cast(z, z32);
  DeviceTensor dh(be, DType::fp32, {m, n});
  sdk::GemmArgs g;
  g.a = {dy, false};
  g.b = {w, false};
  g.c = dh;
  g.compute = DType::bf16;
  sdk::facet<sdk::GemmFacet>(be)->gemm(g);
  sdk::facet<sdk::ActivationFacet>(be)->activation_backward(sdk::Activation::gelu, z32, dh, dh);
  DeviceTensor want(be, DType::bf16, {m, n});
  be.cast(dh, want);
  DeviceTensor dz(be, DType::bf16, {m, n});
  sdk::GemmGradientArgs gg;
  gg.gemm = g;
  gg.gemm.c = dz;
  gg.has_activation_grad = true;
  gg.pre_activation = z;
  sdk::facet<sdk::GemmFacet>(be)->gemm_gradient(gg);
  EXPECT_EQ(dz.get(), want.get());
}

TEST(backend_cpu_gemm_gradient, WgradRowSumsOfTheTransposedOperandAreTheBiasGradient) {
  CpuBackend be(2);
  auto& gemm = *sdk::facet<sdk::GemmFacet>(be);
  auto& act = *sdk::facet<sdk::ActivationFacet>(be);
  const std::int64_t rows = 23, out = 18, in = 27;
  const auto dy = random_values(static_cast<std::size_t>(rows * out), 71);
  const auto x = random_values(static_cast<std::size_t>(rows * in), 72);
  const auto dw0 = random_values(static_cast<std::size_t>(out * in), 73);
  const auto db0 = random_values(static_cast<std::size_t>(out), 74);
  for (DType dt : {DType::fp32, DType::bf16})
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(std::string(sdk::dtype_name(dt)) + (accumulate ? " accumulate" : ""));
      DeviceTensor dy_t(be, dt, {rows, out}, dy);
      DeviceTensor x_t(be, dt, {rows, in}, x);
      sdk::GemmArgs g;  // dW[out, in] (+)= dyᵀ · x
      g.a = {dy_t, true};
      g.b = {x_t, false};
      g.alpha = 0.5f;  // LoRA's scale: the weight's gradient only, never the bias's
      g.beta = accumulate ? 1.0f : 0.0f;
      g.compute = dt;
      DeviceTensor want_dw(be, DType::fp32, {out, in}, dw0);
      DeviceTensor want_db(be, DType::fp32, {out}, db0);
      g.c = want_dw;
      gemm.gemm(g);
      act.bias_grad(dy_t, want_db, accumulate);

      DeviceTensor dw(be, DType::fp32, {out, in}, dw0);
      DeviceTensor db(be, DType::fp32, {out}, db0);
      sdk::GemmGradientArgs gg;
      gg.gemm = g;
      gg.gemm.c = dw;
      gg.a_row_sums = db;
      gg.accumulate_a_row_sums = accumulate;
      gemm.gemm_gradient(gg);
      EXPECT_EQ(dw.get(), want_dw.get());
      EXPECT_EQ(db.get(), want_db.get());
    }
}

TEST(backend_cpu_gemm_gradient, SixteenBitDgradRoundsOnceNotTwice) {
  // The unfused ops round dy·W into dx's dtype and then dz again; the epilogue rounds dz once.
  CpuBackend be(1);
  auto& gemm = *sdk::facet<sdk::GemmFacet>(be);
  const std::int64_t m = 64, n = 64, k = 32;
  DeviceTensor dy(be, DType::bf16, {m, k}, random_values(static_cast<std::size_t>(m * k), 81));
  DeviceTensor w(be, DType::bf16, {k, n}, random_values(static_cast<std::size_t>(k * n), 82));
  DeviceTensor z(be, DType::bf16, {m, n}, random_values(static_cast<std::size_t>(m * n), 83));
  DeviceTensor dh(be, DType::bf16, {m, n});
  DeviceTensor twice(be, DType::bf16, {m, n});
  DeviceTensor once(be, DType::bf16, {m, n});
  sdk::GemmArgs g;
  g.a = {dy, false};
  g.b = {w, false};
  g.c = dh;
  g.compute = DType::bf16;
  gemm.gemm(g);
  sdk::facet<sdk::ActivationFacet>(be)->activation_backward(sdk::Activation::gelu, z, dh, twice);
  sdk::GemmGradientArgs gg;
  gg.gemm = g;
  gg.gemm.c = once;
  gg.has_activation_grad = true;
  gg.pre_activation = z;
  gemm.gemm_gradient(gg);
  const auto o = once.get(), t = twice.get(), h = dh.get();
  std::size_t differ = 0;
  for (std::size_t i = 0; i < o.size(); ++i) {
    differ += o[i] != t[i];
    // Only by the extra rounding: half a bf16 step of dy·W times |gelu'| (< 1.13), plus a step.
    EXPECT_LE(std::abs(o[i] - t[i]), 0x1p-8f * (std::abs(t[i]) + 1.13f * std::abs(h[i]))) << i;
  }
  EXPECT_GT(differ, 0u) << "one rounding should differ from two somewhere";
}

TEST(backend_cpu_gemm_epilogue, EmptyInnerDimensionAppliesTheActivationToBetaCPlusBias) {
  CpuBackend be(1);
  DeviceTensor a(be, DType::fp32, {2, 0});
  DeviceTensor b(be, DType::fp32, {0, 2});
  DeviceTensor c(be, DType::fp32, {2, 2}, {1, -2, 3, -4});
  DeviceTensor pre(be, DType::bf16, {2, 2});
  DeviceTensor bias(be, DType::fp32, {2}, {0.5f, 1.0f});
  sdk::GemmArgs args;
  args.a = {a, false};
  args.b = {b, false};
  args.c = c;
  args.beta = 1.0f;
  args.bias = bias;
  args.has_activation = true;
  args.activation = sdk::Activation::relu;
  args.pre_activation = pre;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  EXPECT_EQ(c.get(), (std::vector<float>{1.5f, 0.0f, 3.5f, 0.0f}));
  EXPECT_EQ(pre.get(), (std::vector<float>{1.5f, -1.0f, 3.5f, -3.0f}));
}

TEST(backend_cpu_gemm_epilogue, BadPreActivationArgumentsRaiseBackendError) {
  CpuBackend be(1);
  DeviceTensor a(be, DType::fp32, {4, 3});
  DeviceTensor b(be, DType::fp32, {3, 5});
  DeviceTensor c(be, DType::fp32, {4, 5});
  DeviceTensor wrong(be, DType::fp32, {4, 4});
  DeviceTensor labels(be, DType::int32, {4, 5});
  sdk::GemmArgs args;
  args.a = {a, false};
  args.b = {b, false};
  args.c = c;
  DeviceTensor pre(be, DType::fp32, {4, 5});
  args.pre_activation = pre;  // without an activation
  EXPECT_THROW(sdk::facet<sdk::GemmFacet>(be)->gemm(args), sdk::BackendError);
  args.has_activation = true;
  args.pre_activation = wrong;  // wrong shape
  EXPECT_THROW(sdk::facet<sdk::GemmFacet>(be)->gemm(args), sdk::BackendError);
  args.pre_activation = labels;  // not a float
  EXPECT_THROW(sdk::facet<sdk::GemmFacet>(be)->gemm(args), sdk::BackendError);
  args.pre_activation = c;  // overlaps C
  try {
    sdk::facet<sdk::GemmFacet>(be)->gemm(args);
    FAIL() << "an overlapping pre_activation must be rejected";
  } catch (const sdk::BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("overlap"), std::string::npos) << e.what();
  }
  args.pre_activation = pre;
  EXPECT_NO_THROW(sdk::facet<sdk::GemmFacet>(be)->gemm(args));
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
