// CudaBackend::gemm against the CPU reference: every input dtype (fp32, tf32, bf16, fp16, FP8 and
// mixes), every transpose combination, fp32/bf16/fp16 outputs, alpha/beta, bias, odd shapes,
// FP8 scales and layouts, empty dimensions and shape errors.
//
// Tolerances follow from the formats: both backends see the same exactly-representable inputs
// and accumulate in FP32 (in different orders), so the difference is bounded by a few FP32 ulps
// of sum|a||b| (1e-5 relative); tf32 allows one input rounding each side (the Tensor Core may
// truncate where the CPU rounds to nearest): 2^-8 of sum|a||b|; a 16-bit C may differ by one unit
// of its format when the two FP32 results straddle a rounding boundary.
#include <cmath>

#include "cuda_test_util.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cuda::testing {
namespace {

struct GemmCase {
  DType a, b, c;
  bool ta, tb;
  std::int64_t m, n, k;
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;
  DType compute = DType::fp32;
  float scale_a = 1.0f, scale_b = 1.0f;
};

std::string name_of(const GemmCase& g) {
  return std::string(sdk::dtype_name(g.a)) + (g.ta ? "^T" : "") + " x " +
         std::string(sdk::dtype_name(g.b)) + (g.tb ? "^T" : "") + " -> " +
         std::string(sdk::dtype_name(g.c)) + " m" + std::to_string(g.m) + " n" +
         std::to_string(g.n) + " k" + std::to_string(g.k) + " alpha " + std::to_string(g.alpha) +
         " beta " + std::to_string(g.beta) + (g.bias ? " bias" : "") +
         (g.compute == DType::tf32 ? " compute tf32" : "");
}

// Values stored exactly in `t` (decoded back), as both backends will see them.
std::vector<float> stored(std::vector<float> v, DType t) {
  return decode(encode(v, t), t);
}

double input_rel(const GemmCase& g) {
  const bool tf32 = g.compute == DType::tf32 || g.a == DType::tf32 || g.b == DType::tf32;
  // Hopper's FP8 Tensor Cores accumulate with ~14 mantissa bits between cuBLASLt's promotions to
  // FP32 (DeepSeek-V3 report, §3.3.2): measured on an H200, up to ~2e-5 of sum|a||b| at k = 64.
  if (sdk::is_fp8(g.a) && sdk::is_fp8(g.b)) return 0x1p-12;
  return tf32 ? 0x1p-8 : 1e-5;
}

void run_case(CudaBackend& gpu, backend_cpu::CpuBackend& cpu, const GemmCase& g,
              std::uint32_t seed) {
  const std::string what = name_of(g);
  const Shape sa = g.ta ? Shape{g.k, g.m} : Shape{g.m, g.k};
  const Shape sb = g.tb ? Shape{g.n, g.k} : Shape{g.k, g.n};
  const float range_a = sdk::is_fp8(g.a) ? 8.0f : 1.0f;
  const float range_b = sdk::is_fp8(g.b) ? 8.0f : 1.0f;
  const auto av = stored(random_values(static_cast<std::size_t>(g.m * g.k), seed, -range_a, range_a), g.a);
  const auto bv = stored(random_values(static_cast<std::size_t>(g.k * g.n), seed + 1, -range_b, range_b), g.b);
  const auto cv = stored(random_values(static_cast<std::size_t>(g.m * g.n), seed + 2), g.c);
  const auto biasv = random_values(static_cast<std::size_t>(g.n), seed + 3);

  auto run = [&](sdk::DeviceBackend& be) {
    Tensor a(be, g.a, sa, av), b(be, g.b, sb, bv), c(be, g.c, {g.m, g.n}, cv);
    Tensor bias(be, DType::fp32, {g.n}, biasv);
    sdk::GemmArgs args;
    args.a = {a, g.ta, g.scale_a};
    args.b = {b, g.tb, g.scale_b};
    args.c = c;
    args.alpha = g.alpha;
    args.beta = g.beta;
    if (g.bias) args.bias = bias;
    args.compute = g.compute;
    sdk::facet<sdk::GemmFacet>(be)->gemm(args);
    return c.get();
  };
  const auto got = run(gpu);
  const auto want = run(cpu);

  // Per-element bound: rel * alpha * sum|a||b| (+ beta*|c| rounding) + one unit of C's format.
  const double rel = input_rel(g);
  for (std::int64_t i = 0; i < g.m; ++i)
    for (std::int64_t j = 0; j < g.n; ++j) {
      double mag = 0.0;
      for (std::int64_t p = 0; p < g.k; ++p) {
        const float x = g.ta ? av[static_cast<std::size_t>(p * g.m + i)] : av[static_cast<std::size_t>(i * g.k + p)];
        const float y = g.tb ? bv[static_cast<std::size_t>(j * g.k + p)] : bv[static_cast<std::size_t>(p * g.n + j)];
        mag += std::fabs(static_cast<double>(x) * g.scale_a * y * g.scale_b);
      }
      const std::size_t idx = static_cast<std::size_t>(i * g.n + j);
      const double want_v = want[idx];
      // A 16-bit C may get the bias rounded to C's dtype first (cuda_gemm.h: the narrowed-bias
      // route, as autocast does), one more rounding of |bias|.
      const double bias_rounding =
          g.bias && g.c != DType::fp32 ? ulp_rel(g.c) * std::fabs(biasv[static_cast<std::size_t>(j)]) : 0.0;
      const double tol = rel * (std::fabs(g.alpha) * mag + std::fabs(g.beta * cv[idx]) + 1.0) +
                         ulp_rel(g.c) * std::fabs(want_v) + bias_rounding + 1e-6;
      ASSERT_NEAR(got[idx], want_v, tol) << what << " at (" << i << ", " << j << ")";
    }
}

TEST_F(backend_cuda_vs_cpu, GemmEveryInputAndOutputDtypeAndTranspose) {
  std::uint32_t seed = 100;
  for (DType in : {DType::fp32, DType::tf32, DType::bf16, DType::fp16})
    for (DType out : {DType::fp32, DType::bf16, DType::fp16})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          run_case(gpu(), cpu(), {in, in, out, ta, tb, 64, 48, 32}, seed++);
}

TEST_F(backend_cuda_vs_cpu, GemmOddShapesAlphaBetaBias) {
  std::uint32_t seed = 200;
  for (DType in : {DType::fp32, DType::bf16, DType::fp16})
    for (DType out : {DType::fp32, DType::bf16, DType::fp16})
      for (bool bias : {false, true}) {
        run_case(gpu(), cpu(), {in, in, out, false, true, 37, 29, 53, 0.75f, 0.5f, bias}, seed++);
        run_case(gpu(), cpu(), {in, in, out, true, false, 5, 130, 7, -2.0f, 1.0f, bias}, seed++);
        run_case(gpu(), cpu(), {in, in, out, false, false, 1, 1, 1, 1.0f, 0.0f, bias}, seed++);
      }
}

TEST_F(backend_cuda_vs_cpu, GemmTf32ComputeOnFp32Views) {
  run_case(gpu(), cpu(), {DType::fp32, DType::fp32, DType::fp32, false, true, 96, 64, 128, 1.0f,
                          0.0f, true, DType::tf32},
           300);
  run_case(gpu(), cpu(), {DType::tf32, DType::fp32, DType::bf16, true, true, 33, 17, 65}, 301);
}

TEST_F(backend_cuda_vs_cpu, GemmFp8EveryMixLayoutAndScale) {
  if (gpu().sm_version() < 89) {
    // No FP8 Tensor Cores: FP8 is refused with the reason, never emulated on the GPU.
    Tensor a(gpu(), DType::fp8_e4m3, {16, 16}), b(gpu(), DType::fp8_e4m3, {16, 16});
    Tensor c(gpu(), DType::fp32, {16, 16});
    sdk::GemmArgs args;
    args.a = {a};
    args.b = {b, true};
    args.c = c;
    try {
      gpu<sdk::GemmFacet>().gemm(args);
      FAIL() << "an FP8 GEMM before sm_89 must raise BackendError";
    } catch (const sdk::BackendError& e) {
      EXPECT_NE(std::string(e.what()).find("sm_89"), std::string::npos) << e.what();
    }
    return;
  }
  std::uint32_t seed = 400;
  for (DType a : {DType::fp8_e4m3, DType::fp8_e5m2})
    for (DType b : {DType::fp8_e4m3, DType::fp8_e5m2})
      for (DType out : {DType::fp32, DType::bf16, DType::fp16})
        for (bool ta : {false, true})
          for (bool tb : {false, true}) {
            // k multiple of 16: the native FP8 path where the device has one.
            GemmCase g{a, b, out, ta, tb, 64, 32, 64, 1.0f, 0.0f, true};
            g.scale_a = 0.5f;
            g.scale_b = 0.125f;
            run_case(gpu(), cpu(), g, seed++);
          }
  // k not a multiple of 16, beta != 0, non-power-of-two scale: the decoded path.
  GemmCase g{DType::fp8_e4m3, DType::fp8_e4m3, DType::fp32, false, true, 17, 24, 40, 1.5f, 0.5f, true};
  g.scale_a = 0.3f;
  g.scale_b = 3.0f;
  run_case(gpu(), cpu(), g, 500);
  g.k = 41;
  run_case(gpu(), cpu(), g, 501);
}

// The decoded fallback gives the same numbers as the native FP8 path, only at bf16 speed, so the
// value tests above cannot tell them apart: the plan report can. (cuBLASLt 13 once declined every
// FP8 algorithm at the matmul because a scale pointer was 4-byte aligned; FP8 then ran at 0.93x
// of bf16 on an H200 while every value test passed.)
TEST_F(backend_cuda_vs_cpu, GemmFp8RunsOnFp8TensorCoresNotTheDecodedFallback) {
  if (gpu().sm_version() < 89) GTEST_SKIP() << "no FP8 Tensor Cores before sm_89";
  for (DType out : {DType::bf16, DType::fp32}) {
    Tensor a(gpu(), DType::fp8_e4m3, {64, 64}), b(gpu(), DType::fp8_e4m3, {32, 64});
    Tensor c(gpu(), out, {64, 32});
    sdk::GemmArgs args;
    args.a = {a, false, 0.5f};
    args.b = {b, true, 2.0f};
    args.c = c;
    gpu<sdk::GemmFacet>().gemm(args);
  }
  int native = 0;
  for (const std::string& line : gpu().gemm_plan_report()) {
    if (line.find("fp8-scales") == std::string::npos) continue;
    EXPECT_NE(line.find(": usable, 1 runs"), std::string::npos) << line;
    ++native;
  }
  EXPECT_EQ(native, 2);
}

TEST_F(backend_cuda_vs_cpu, GemmMixedInputDtypes) {
  std::uint32_t seed = 600;
  const std::pair<DType, DType> mixes[] = {{DType::fp32, DType::bf16},     {DType::bf16, DType::fp16},
                                           {DType::fp16, DType::fp32},     {DType::fp8_e4m3, DType::bf16},
                                           {DType::fp16, DType::fp8_e5m2}, {DType::fp8_e5m2, DType::fp32}};
  for (const auto& [a, b] : mixes) {
    if ((sdk::is_fp8(a) || sdk::is_fp8(b)) && gpu().sm_version() < 89) continue;  // refused
    for (DType out : {DType::fp32, DType::bf16})
      run_case(gpu(), cpu(), {a, b, out, false, true, 24, 40, 48, 1.0f, 0.0f, true}, seed++);
  }
}

TEST_F(backend_cuda_vs_cpu, GemmLargerShapeAndPlanCache) {
  run_case(gpu(), cpu(), {DType::bf16, DType::bf16, DType::bf16, false, true, 256, 384, 512, 1.0f,
                          0.0f, true},
           700);
  const auto plans = gpu().cached_gemm_plans();
  run_case(gpu(), cpu(), {DType::bf16, DType::bf16, DType::bf16, false, true, 256, 384, 512, 1.0f,
                          0.0f, true},
           701);
  EXPECT_EQ(gpu().cached_gemm_plans(), plans) << "the same GEMM key must reuse its plan";
}

// gemm_realign: an LM head's GEMMs with an odd vocabulary (1001 here, 50257 in GPT-2), whose rows
// are not 16 bytes apart, run on padded copies and still give the CPU's results: the forward
// (C [rows, V]), the input gradient (A [rows, V], k = V) and the weight gradient (A read
// transposed, accumulating); m·n·k above the realignment threshold. The plan report shows the
// padded leading dimensions.
TEST_F(backend_cuda_vs_cpu, GemmRealignedRowsMatchTheCpu) {
  CudaBackend realigned(CudaOptions{.device = 0, .gemm_realign = true});
  std::uint32_t seed = 900;
  for (DType out : {DType::bf16, DType::fp32}) {
    run_case(realigned, cpu(), {DType::bf16, DType::bf16, out, false, true, 1024, 1001, 256},
             seed++);
    run_case(realigned, cpu(),
             {DType::bf16, DType::bf16, out, false, true, 1024, 1001, 256, 1.0f, 1.0f}, seed++);
    run_case(realigned, cpu(), {DType::bf16, DType::bf16, out, false, false, 1024, 256, 1001},
             seed++);
    run_case(realigned, cpu(),
             {DType::bf16, DType::bf16, out, true, false, 1001, 256, 1024, 1.0f, 1.0f}, seed++);
  }
  int padded = 0;
  for (const std::string& line : realigned.gemm_plan_report())
    if (line.find("realigned-ld=") != std::string::npos &&
        line.find(": usable") != std::string::npos)
      ++padded;
  EXPECT_GE(padded, 4) << "no GEMM ran on realigned rows";
  // Off (the default), the same shapes run as they are.
  run_case(gpu(), cpu(), {DType::bf16, DType::bf16, DType::bf16, false, true, 1024, 1001, 256},
           950);
  for (const std::string& line : gpu().gemm_plan_report())
    EXPECT_EQ(line.find("realigned-ld="), std::string::npos) << line;
}

// gemm_autotune = 4: the key's first call times its candidates, each several times; a beta != 0
// GEMM is timed on a scratch D, so C is accumulated once, and the realigned route too. Each
// case's first call is the timed one, compared with the CPU like any other.
TEST_F(backend_cuda_vs_cpu, GemmAutotunedAccumulatesIntoCOnceAndMatchesTheCpu) {
  std::uint32_t seed = 1300;
  for (const bool realign : {false, true}) {
    CudaBackend tuned(CudaOptions{.device = 0, .gemm_autotune = 4, .gemm_realign = realign});
    for (DType out : {DType::bf16, DType::fp32}) {
      // At least kRealignMinMacs (2^27) multiply-adds each, so the realigned pass realigns.
      run_case(tuned, cpu(), {DType::bf16, DType::bf16, out, false, true, 1024, 1001, 256}, seed++);
      run_case(tuned, cpu(),
               {DType::bf16, DType::bf16, out, false, true, 1024, 1001, 256, 1.0f, 1.0f}, seed++);
      run_case(tuned, cpu(),
               {DType::bf16, DType::bf16, out, true, false, 1001, 256, 1024, 0.5f, 1.0f, true},
               seed++);
    }
    int timed = 0, realigned = 0;
    for (const std::string& line : tuned.gemm_plan_report()) {
      timed += line.find("autotuned over") != std::string::npos;
      realigned += line.find("realigned-ld=") != std::string::npos;
    }
    EXPECT_GE(timed, 1) << "no GEMM was autotuned" << (realign ? " (realigned)" : "");
    if (realign) {
      EXPECT_GE(realigned, 1) << "no autotuned GEMM ran on realigned rows";
    }
  }
}

TEST_F(backend_cuda_vs_cpu, GemmEmptyDimensions) {
  // k = 0: C = beta*C + bias.
  run_case(gpu(), cpu(), {DType::fp32, DType::fp32, DType::fp32, false, false, 4, 6, 0, 1.0f, 0.5f, true}, 800);
  run_case(gpu(), cpu(), {DType::bf16, DType::bf16, DType::bf16, false, false, 4, 6, 0, 1.0f, 0.0f, true}, 801);
  // m = 0: nothing to do.
  Tensor a(gpu(), DType::fp32, {0, 8}), b(gpu(), DType::fp32, {8, 4}), c(gpu(), DType::fp32, {0, 4});
  sdk::GemmArgs args;
  args.a = {a};
  args.b = {b};
  args.c = c;
  EXPECT_NO_THROW(gpu<sdk::GemmFacet>().gemm(args));
}

TEST_F(backend_cuda_vs_cpu, GemmShapeAndDtypeErrors) {
  Tensor a(gpu(), DType::fp32, {4, 8}), b(gpu(), DType::fp32, {7, 4}), c(gpu(), DType::fp32, {4, 4});
  sdk::GemmArgs args;
  args.a = {a};
  args.b = {b};
  args.c = c;
  EXPECT_THROW(gpu<sdk::GemmFacet>().gemm(args), sdk::BackendError);  // inner dims 8 vs 7
  Tensor b2(gpu(), DType::fp32, {8, 4}), c2(gpu(), DType::fp32, {4, 5});
  args.b = {b2};
  args.c = c2;
  EXPECT_THROW(gpu<sdk::GemmFacet>().gemm(args), sdk::BackendError);  // C shape
  Tensor c3(gpu(), DType::fp8_e4m3, {4, 4});
  args.c = c3;
  EXPECT_THROW(gpu<sdk::GemmFacet>().gemm(args), sdk::BackendError);  // fp8 C
  Tensor labels(gpu(), DType::int32, {4, 8});
  args.a = {labels};
  args.c = c;
  EXPECT_THROW(gpu<sdk::GemmFacet>().gemm(args), sdk::BackendError);  // int32 input
  Tensor bias(gpu(), DType::bf16, {4});
  args.a = {a};
  args.bias = bias;
  EXPECT_THROW(gpu<sdk::GemmFacet>().gemm(args), sdk::BackendError);  // bias must be fp32
}

}  // namespace
}  // namespace mixtrain::backend_cuda::testing
