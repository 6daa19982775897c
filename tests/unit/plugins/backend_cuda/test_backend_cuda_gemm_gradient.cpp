// GemmFacet::gemm_gradient (gemm facet 1.5) on the CUDA backend against the contract
// (sdk/backend_gemm.h, GemmGradientArgs), computed on the host: z = alpha·op(A)·op(B) + beta·C in
// double rounded to FP32, times gelu'(pre_activation) from the CPU backend's element math
// (activation_backward with dy = 1), rounded once into C; c_column_sums the sums of the device's C
// as stored, a_row_sums the column sums of the stored A [k, m]; each sum accumulated or
// overwritten. fp32 and bf16, with and without the activation gradient (pre_activation in C's
// dtype and in fp32), each sum, n = 64 (cuBLASLt's DGELU where beta = 0) and n = 30 (the fp32
// GEMM and the gradient kernel), beta 0 and 0.5. Where the CPU backend runs gemm_gradient too,
// the two backends are compared as well. Skipped without a device (cuda_test_util.h's fixture).
//
// Tolerances from the formats: FP32 accumulation in another order moves z by k·2^-24 of
// |alpha|·Σ|a||b| (+ 2^-24 of |beta·c|); gelu' by cuBLASLt's DGELU may use a hardware tanh
// (~2^-11 relative, as the forward's GELU epilogue: tests/conformance/conformance_gemm.cpp),
// which moves gelu' by up to 2^-10 of its terms' scale, by the gradient kernel 4 ulps at that
// scale (test_cuda_element_math.cpp), both times |z|; then one rounding into C: a 16-bit C may be
// one unit of its format (2^-7 relative for bf16) away when the two FP32 values straddle a
// rounding boundary. The sums are FP32 within splits of
// at most 64 rows and double across them: (m + 1)·2^-24 of Σ|c| is generous; and they must equal
// bias_grad on the same tensor bit for bit (one kernel).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cuda::testing {
namespace {

constexpr double kGeluK = 0.7978845608028654;
constexpr double kGeluC = 0.044715;

struct GradCase {
  DType dtype;  // A, B and C
  bool act;
  DType pre;
  std::int64_t m, n, k;
  float alpha, beta;
  bool tb;
  bool c_sums, a_sums, accumulate;
};

std::string name_of(const GradCase& g) {
  return std::string(sdk::dtype_name(g.dtype)) + " m" + std::to_string(g.m) + " n" +
         std::to_string(g.n) + " k" + std::to_string(g.k) + (g.tb ? " B^T" : "") + " beta " +
         std::to_string(g.beta) +
         (g.act ? " gelu' pre " + std::string(sdk::dtype_name(g.pre)) : "") +
         (g.c_sums ? " c_column_sums" : "") + (g.a_sums ? " a_row_sums" : "") +
         (g.accumulate ? " accumulate" : "");
}

std::vector<float> stored(std::vector<float> v, DType t) {
  return decode(encode(v, t), t);
}

// One unit of C's format at |v|: where two FP32 values that straddle a rounding boundary land.
double unit_of(DType t, double v) {
  if (t == DType::fp32) return 0x1p-23 * std::fabs(v);
  return ulp_rel(t) * std::fabs(v) + (t == DType::bf16 ? 0x1p-133 : 0x1p-24);
}

struct Outputs {
  std::vector<float> c, c_sums, a_sums;
};

// Runs gemm_gradient of `g` on `be` with the given host values; sums start at `init`.
Outputs run_gradient(sdk::DeviceBackend& be, const GradCase& g, const std::vector<float>& av,
                     const std::vector<float>& bv, const std::vector<float>& cv,
                     const std::vector<float>& pv, const std::vector<float>& c_init,
                     const std::vector<float>& a_init) {
  Tensor a(be, g.dtype, {g.k, g.m}, av);  // A stored [k, m]: op(A) = Aᵀ, as wgrad's dyᵀ
  Tensor b(be, g.dtype, g.tb ? Shape{g.n, g.k} : Shape{g.k, g.n}, bv);
  Tensor c(be, g.dtype, {g.m, g.n}, cv);
  Tensor pre(be, g.pre, {g.m, g.n}, pv);
  Tensor c_sums(be, DType::fp32, {g.n}, c_init), a_sums(be, DType::fp32, {g.m}, a_init);
  sdk::GemmGradientArgs args;
  args.gemm.a = {a, true};
  args.gemm.b = {b, g.tb};
  args.gemm.c = c;
  args.gemm.alpha = g.alpha;
  args.gemm.beta = g.beta;
  args.has_activation_grad = g.act;
  if (g.act) args.pre_activation = pre;
  if (g.c_sums) args.c_column_sums = c_sums;
  if (g.a_sums) args.a_row_sums = a_sums;
  args.accumulate_c_column_sums = args.accumulate_a_row_sums = g.accumulate;
  sdk::facet<sdk::GemmFacet>(be)->gemm_gradient(args);
  return {c.get(), c_sums.get(), a_sums.get()};
}

// gelu'(x) for each stored pre_activation value, from the CPU backend's activation_backward with
// dy = 1 (bf16, so the dtypes differ and the CPU runs its own formula rather than oneDNN's).
std::vector<float> cpu_gelu_grad(backend_cpu::CpuBackend& cpu, DType pre_t,
                                 const std::vector<float>& pv) {
  const auto n = static_cast<std::int64_t>(pv.size());
  Tensor x(cpu, pre_t, {n}, pv), ones(cpu, DType::bf16, {n}, std::vector<float>(pv.size(), 1.0f));
  Tensor g(cpu, DType::fp32, {n});
  sdk::facet<sdk::ActivationFacet>(cpu)->activation_backward(sdk::Activation::gelu, x, ones, g);
  return g.get();
}

void check_case(CudaBackend& gpu, backend_cpu::CpuBackend& cpu, const GradCase& g,
                std::uint32_t seed) {
  const std::string what = name_of(g);
  const auto av = stored(random_values(static_cast<std::size_t>(g.k * g.m), seed), g.dtype);
  const auto bv = stored(random_values(static_cast<std::size_t>(g.k * g.n), seed + 1), g.dtype);
  const auto cv = stored(random_values(static_cast<std::size_t>(g.m * g.n), seed + 2), g.dtype);
  const auto pv =
      stored(random_values(static_cast<std::size_t>(g.m * g.n), seed + 3, -3.0f, 3.0f), g.pre);
  // Overwritten sums start at values a missed overwrite would leave visible.
  const auto c_init = random_values(static_cast<std::size_t>(g.n), seed + 4, 100.0f, 200.0f);
  const auto a_init = random_values(static_cast<std::size_t>(g.m), seed + 5, 100.0f, 200.0f);
  const Outputs got = run_gradient(gpu, g, av, bv, cv, pv, c_init, a_init);
  const std::vector<float> grad = g.act ? cpu_gelu_grad(cpu, g.pre, pv) : std::vector<float>{};

  // DGELU can take only beta = 0, n % 8 == 0 and a pre_activation in D's dtype (cuda_gemm.h).
  const bool maybe_dgelu = g.act && g.beta == 0.0f && g.n % 8 == 0;
  std::vector<double> want_c(static_cast<std::size_t>(g.m * g.n)), tol_c(want_c.size());
  for (std::int64_t i = 0; i < g.m; ++i)
    for (std::int64_t j = 0; j < g.n; ++j) {
      double dot = 0.0, mag = 0.0;
      for (std::int64_t p = 0; p < g.k; ++p) {
        const double x = av[static_cast<std::size_t>(p * g.m + i)];
        const double y = g.tb ? bv[static_cast<std::size_t>(j * g.k + p)]
                              : bv[static_cast<std::size_t>(p * g.n + j)];
        dot += x * y;
        mag += std::fabs(x * y);
      }
      const std::size_t idx = static_cast<std::size_t>(i * g.n + j);
      const double beta_c = static_cast<double>(g.beta) * cv[idx];
      const auto z = static_cast<float>(g.alpha * dot + beta_c);
      double acc = static_cast<double>(g.k) * 0x1p-24 * std::fabs(g.alpha) * mag +
                   0x1p-24 * std::fabs(beta_c) + 0x1p-24 * std::fabs(z);
      float product = z;
      if (g.act) {
        const float d = grad[idx];
        product = z * d;
        const double x = std::fabs(static_cast<double>(pv[idx]));
        const double terms = 0.5 * (1.0 + x * kGeluK * (1.0 + 3.0 * kGeluC * x * x));
        acc = acc * std::fabs(d) + (maybe_dgelu ? 0x1p-10 : 0x1p-20) * terms * std::fabs(z) +
              0x1p-24 * std::fabs(product);
      }
      // One rounding into C.
      want_c[idx] = stored({product}, g.dtype)[0];
      tol_c[idx] = acc + unit_of(g.dtype, want_c[idx]);
    }
  for (std::size_t i = 0; i < want_c.size(); ++i) {
    ASSERT_NEAR(got.c[i], want_c[i], tol_c[i]) << what << " at " << i;
  }

  // The sums of C as stored (the device's C) and of the stored A, exact (double), and their
  // bounds.
  std::vector<double> c_sum(static_cast<std::size_t>(g.n)), c_bound(c_sum.size());
  for (std::int64_t j = 0; j < g.n; ++j) {
    const auto jj = static_cast<std::size_t>(j);
    double sum = g.accumulate ? c_init[jj] : 0.0, mag = std::fabs(sum);
    for (std::int64_t i = 0; i < g.m; ++i) {
      sum += got.c[static_cast<std::size_t>(i * g.n + j)];
      mag += std::fabs(got.c[static_cast<std::size_t>(i * g.n + j)]);
    }
    c_sum[jj] = sum;
    c_bound[jj] = static_cast<double>(g.m + 1) * 0x1p-24 * mag;
  }
  std::vector<double> a_sum(static_cast<std::size_t>(g.m)), a_bound(a_sum.size());
  for (std::int64_t i = 0; i < g.m; ++i) {
    const auto ii = static_cast<std::size_t>(i);
    double sum = g.accumulate ? a_init[ii] : 0.0, mag = std::fabs(sum);
    for (std::int64_t p = 0; p < g.k; ++p) {
      sum += av[static_cast<std::size_t>(p * g.m + i)];
      mag += std::fabs(av[static_cast<std::size_t>(p * g.m + i)]);
    }
    a_sum[ii] = sum;
    a_bound[ii] = static_cast<double>(g.k + 1) * 0x1p-24 * mag;
  }
  if (g.c_sums) {
    for (std::size_t j = 0; j < c_sum.size(); ++j)
      ASSERT_NEAR(got.c_sums[j], c_sum[j], c_bound[j]) << what << " c_column_sums[" << j << "]";
  } else {
    EXPECT_EQ(got.c_sums, c_init) << what << ": c_column_sums written without being asked for";
  }
  if (g.a_sums) {
    for (std::size_t i = 0; i < a_sum.size(); ++i)
      ASSERT_NEAR(got.a_sums[i], a_sum[i], a_bound[i]) << what << " a_row_sums[" << i << "]";
  } else {
    EXPECT_EQ(got.a_sums, a_init) << what << ": a_row_sums written without being asked for";
  }

  // The sums are bias_grad's, bit for bit: the same kernel over the same stored tensors.
  if (g.c_sums || g.a_sums) {
    Tensor c(gpu, g.dtype, {g.m, g.n}, got.c), a(gpu, g.dtype, {g.k, g.m}, av);
    Tensor c_sums(gpu, DType::fp32, {g.n}, c_init), a_sums(gpu, DType::fp32, {g.m}, a_init);
    auto& act = facet_of<sdk::ActivationFacet>(gpu);
    if (g.c_sums) {
      act.bias_grad(c, c_sums, g.accumulate);
      EXPECT_EQ(got.c_sums, c_sums.get()) << what << ": c_column_sums differ from bias_grad";
    }
    if (g.a_sums) {
      act.bias_grad(a, a_sums, g.accumulate);
      EXPECT_EQ(got.a_sums, a_sums.get()) << what << ": a_row_sums differ from bias_grad";
    }
  }

  // Against the CPU backend where it runs gemm_gradient: each within the contract's bounds, so
  // within twice them of each other (the CPU's C differs from ours by up to 2·tol_c per element).
  const DType dtypes[] = {g.dtype, g.dtype, g.dtype};
  if (!sdk::facet<sdk::GemmFacet>(cpu)->supports(sdk::GemmOp::gemm_gradient, dtypes)) return;
  const Outputs ref = run_gradient(cpu, g, av, bv, cv, pv, c_init, a_init);
  for (std::size_t i = 0; i < want_c.size(); ++i)
    ASSERT_NEAR(got.c[i], ref.c[i], 2.0 * tol_c[i]) << what << " vs the CPU backend at " << i;
  if (g.a_sums) {
    for (std::size_t i = 0; i < a_sum.size(); ++i)
      ASSERT_NEAR(got.a_sums[i], ref.a_sums[i], 2.0 * a_bound[i])
          << what << " a_row_sums[" << i << "] vs the CPU backend";
  }
  if (g.c_sums) {
    for (std::int64_t j = 0; j < g.n; ++j) {
      const auto jj = static_cast<std::size_t>(j);
      double bound = 2.0 * c_bound[jj];
      for (std::int64_t i = 0; i < g.m; ++i)
        bound += 2.0 * tol_c[static_cast<std::size_t>(i * g.n + j)];
      ASSERT_NEAR(got.c_sums[jj], ref.c_sums[jj], bound)
          << what << " c_column_sums[" << j << "] vs the CPU backend";
    }
  }
}

TEST_F(backend_cuda_vs_cpu, GemmGradientMatchesTheContract) {
  std::uint32_t seed = 900;
  int cases = 0;
  for (DType dt : {DType::fp32, DType::bf16}) {
    std::vector<std::pair<bool, DType>> acts = {{false, dt}, {true, dt}};
    if (dt != DType::fp32) acts.push_back({true, DType::fp32});
    for (const auto& [act, pre] : acts)
      for (std::int64_t n : {std::int64_t{64}, std::int64_t{30}})
        for (float beta : {0.0f, 0.5f})
          for (int sums = 0; sums < 4; ++sums)
            for (bool accumulate : {false, true}) {
              if (sums == 0 && accumulate) continue;
              const GradCase g{dt,
                               act,
                               pre,
                               48,
                               n,
                               40,
                               1.25f,
                               beta,
                               n == 30,
                               (sums & 1) != 0,
                               (sums & 2) != 0,
                               accumulate};
              check_case(gpu(), cpu(), g, seed);
              seed += 8;
              ++cases;
              if (HasFatalFailure()) return;
            }
  }
  EXPECT_EQ(cases, 5 * 2 * 2 * 7);
}

// k = 0: z = beta·C, times gelu'(pre), rounded once; A has no rows, so its sums are 0 (or kept).
TEST_F(backend_cuda_vs_cpu, GemmGradientEmptyInnerDimension) {
  for (bool accumulate : {false, true})
    for (DType dt : {DType::fp32, DType::bf16}) {
      const GradCase g{dt, true, dt, 8, 16, 0, 1.0f, 0.5f, false, true, true, accumulate};
      check_case(gpu(), cpu(), g, accumulate ? 990 : 980);
    }
}

TEST_F(backend_cuda_vs_cpu, GemmGradientSupportsAsGemmAndRefusesWhatTheContractRefuses) {
  auto& facet = gpu<sdk::GemmFacet>();
  for (DType in : {DType::fp32, DType::tf32, DType::bf16, DType::fp16, DType::fp8_e4m3})
    for (DType out : {DType::fp32, DType::bf16, DType::fp16, DType::int32}) {
      const DType d[] = {in, in, out};
      EXPECT_EQ(facet.supports(sdk::GemmOp::gemm_gradient, d), facet.supports(sdk::GemmOp::gemm, d))
          << sdk::dtype_name(in) << " -> " << sdk::dtype_name(out);
    }
  Tensor a(gpu(), DType::bf16, {8, 16}), b(gpu(), DType::bf16, {8, 32}),
      c(gpu(), DType::bf16, {16, 32});
  Tensor pre(gpu(), DType::bf16, {16, 32}), sums(gpu(), DType::fp32, {16});
  sdk::GemmGradientArgs args;
  args.gemm.a = {a, true};
  args.gemm.b = {b, false};
  args.gemm.c = c;
  args.has_activation_grad = true;
  args.pre_activation = pre;
  args.a_row_sums = sums;
  EXPECT_NO_THROW(facet.gemm_gradient(args));
  args.activation = sdk::Activation::relu;  // only gelu's gradient is defined
  EXPECT_THROW(facet.gemm_gradient(args), sdk::BackendError);
  args.activation = sdk::Activation::gelu;
  args.gemm.has_activation = true;  // a forward activation has no place here
  EXPECT_THROW(facet.gemm_gradient(args), sdk::BackendError);
  args.gemm.has_activation = false;
  Tensor a_plain(gpu(), DType::bf16, {16, 8}), b_plain(gpu(), DType::bf16, {8, 32});
  args.gemm.a = {a_plain, false};  // a_row_sums needs A transposed
  args.gemm.b = {b_plain, false};
  EXPECT_THROW(facet.gemm_gradient(args), sdk::BackendError);
}

}  // namespace
}  // namespace mixtrain::backend_cuda::testing
