// CpuBackend's layer norm forward on what the conformance case (one thread, the widest ISA) does
// not reach: every ISA variant of the row kernels (cpu_layernorm_kernels.h), two threads, widths
// with and without a tail of the eight summing lanes, and every pair of storage dtypes, which
// take either the typed kernels (fp32, bf16) or the row path (fp16, mixed). All of them must
// write the same bits for the same values, and match a double reference; the fused residual add
// must be the add, then the layer norm of the sum as stored.
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backend_test_util.h"
#include "isa_variants.h"
#include "mixtrain/sdk/backend_layer_norm.h"
#include "mixtrain/sdk/backend_residual.h"

namespace mixtrain::backend_cpu::testing {
namespace {

constexpr DType kDtypes[] = {DType::fp32, DType::bf16, DType::fp16};

// Integers in [96, 104]: exact in every storage dtype, a mean far from zero against a spread of 4
// (a one-pass E[x²] − E[x]² in fp32 would lose the variance).
std::vector<float> exact_values(std::size_t n, std::uint32_t seed) {
  auto v = random_values(n, seed, 96.0f, 104.999f);
  for (float& x : v) x = std::floor(x);
  return v;
}

struct Outputs {
  std::vector<float> y, mean, rstd;
  bool operator==(const Outputs&) const = default;
};

TEST(BackendCpuLayerNorm, EveryIsaThreadCountAndStoragePairWritesTheSameBits) {
  for (const std::int64_t n : {6, 128, 769}) {
    // rows·n ≥ 2^15: two threads share the rows.
    const std::int64_t rows = std::max<std::int64_t>(70, 40000 / n);
    const auto xv = exact_values(static_cast<std::size_t>(rows * n), 11);
    const auto gv = random_values(static_cast<std::size_t>(n), 12, 0.5f, 1.5f);
    const auto bv = random_values(static_cast<std::size_t>(n), 13, -0.3f, 0.3f);
    // The double reference of the fp32 output.
    std::vector<double> want_y(xv.size()), want_mean(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      double sum = 0.0, sq = 0.0;
      for (std::int64_t j = 0; j < n; ++j) sum += xv[r * n + j];
      const double mu = sum / static_cast<double>(n);
      for (std::int64_t j = 0; j < n; ++j) sq += (xv[r * n + j] - mu) * (xv[r * n + j] - mu);
      const double rs = 1.0 / std::sqrt(sq / static_cast<double>(n) + 1e-5);
      want_mean[r] = mu;
      for (std::int64_t j = 0; j < n; ++j)
        want_y[r * n + j] = (xv[r * n + j] - mu) * rs * gv[j] + bv[j];
    }
    std::optional<Outputs> first_fp32;  // fp32 in, fp32 out, the first run
    std::map<std::pair<DType, DType>, Outputs> first;
    for (const auto& [threads, isa] : thread_and_isa_runs()) {
      const IsaScope as_isa(isa);
      CpuBackend be(threads);
      auto* norm = sdk::facet<sdk::LayerNormFacet>(be);
      DeviceTensor gamma(be, DType::fp32, Shape{n}, gv), beta(be, DType::fp32, Shape{n}, bv);
      for (const DType xt : kDtypes)
        for (const DType yt : kDtypes) {
          const std::string what = isa_name(isa) + ", threads " + std::to_string(threads) + ", n " +
                                   std::to_string(n) + ", x " + std::string(sdk::dtype_name(xt)) +
                                   ", y " + std::string(sdk::dtype_name(yt));
          DeviceTensor x(be, xt, Shape{rows, n}, xv), y(be, yt, Shape{rows, n});
          DeviceTensor mean(be, DType::fp32, Shape{rows}), rstd(be, DType::fp32, Shape{rows});
          norm->layernorm_forward(x, gamma, beta, 1e-5f, y, mean, rstd);
          const Outputs got{y.get(), mean.get(), rstd.get()};
          if (!first_fp32) {
            ASSERT_EQ(xt, DType::fp32);
            ASSERT_EQ(yt, DType::fp32);
            first_fp32 = got;
            EXPECT_LE(relative_error(got.mean, want_mean), 1e-7) << what;
            EXPECT_LE(relative_error(got.y, want_y), 1e-5) << what;
          }
          // The statistics of equal values are equal bits on every path; y is the fp32 output
          // rounded once into its dtype.
          EXPECT_EQ(got.mean, first_fp32->mean) << what;
          EXPECT_EQ(got.rstd, first_fp32->rstd) << what;
          std::vector<float> want_stored = first_fp32->y;
          for (float& v : want_stored) v = stored_value(v, yt);
          EXPECT_EQ(got.y, want_stored) << what;
          const auto [it, fresh] = first.try_emplace({xt, yt}, got);
          if (!fresh) {
            EXPECT_EQ(got, it->second) << what;
          }
        }
      // In place (y is x): the same bits.
      for (const DType dt : kDtypes) {
        DeviceTensor x(be, dt, Shape{rows, n}, xv);
        DeviceTensor mean(be, DType::fp32, Shape{rows}), rstd(be, DType::fp32, Shape{rows});
        norm->layernorm_forward(x, gamma, beta, 1e-5f, x, mean, rstd);
        EXPECT_EQ(x.get(), first.at({dt, dt}).y) << "in place, " << sdk::dtype_name(dt);
      }
    }
  }
}

// On values whose sums round (random floats, every width from 1 past two rounds of the eight
// lanes), each storage pair writes the same bits on every ISA variant and thread count: the
// summing order is the source's, not the vector width's.
TEST(BackendCpuLayerNorm, RoundedSumsAreTheSameBitsOnEveryIsa) {
  for (const std::int64_t n : {1, 7, 8, 9, 17, 100}) {
    const std::int64_t rows = 40000 / n + 1;  // past parallel_worth: two threads share the rows
    const auto xv = random_values(static_cast<std::size_t>(rows * n), 31, -3.0f, 50.0f);
    const auto gv = random_values(static_cast<std::size_t>(n), 32, 0.5f, 1.5f);
    const auto bv = random_values(static_cast<std::size_t>(n), 33, -0.3f, 0.3f);
    std::map<std::pair<DType, DType>, Outputs> first;
    for (const auto& [threads, isa] : thread_and_isa_runs()) {
      const IsaScope as_isa(isa);
      CpuBackend be(threads);
      DeviceTensor gamma(be, DType::fp32, Shape{n}, gv), beta(be, DType::fp32, Shape{n}, bv);
      for (const DType xt : kDtypes)
        for (const DType yt : {DType::fp32, DType::bf16}) {
          DeviceTensor x(be, xt, Shape{rows, n}, xv), y(be, yt, Shape{rows, n});
          DeviceTensor mean(be, DType::fp32, Shape{rows}), rstd(be, DType::fp32, Shape{rows});
          sdk::facet<sdk::LayerNormFacet>(be)->layernorm_forward(x, gamma, beta, 1e-5f, y, mean,
                                                                 rstd);
          const Outputs got{y.get(), mean.get(), rstd.get()};
          const auto [it, fresh] = first.try_emplace({xt, yt}, got);
          if (!fresh) {
            EXPECT_EQ(got, it->second)
                << isa_name(isa) << ", threads " << threads << ", n " << n << ", x "
                << sdk::dtype_name(xt) << ", y " << sdk::dtype_name(yt);
          }
        }
    }
  }
}

TEST(BackendCpuLayerNorm, TheFusedAddIsTheAddThenTheLayerNormOnEveryIsa) {
  const std::int64_t n = 131, rows = 300;  // a tail past the lanes, two threads' worth of rows
  const auto av = random_values(static_cast<std::size_t>(rows * n), 21, 20.0f, 24.0f);
  const auto bv = random_values(static_cast<std::size_t>(rows * n), 22, -1.0f, 1.0f);
  const auto gv = random_values(static_cast<std::size_t>(n), 23, 0.5f, 1.5f);
  const auto beta_v = random_values(static_cast<std::size_t>(n), 24);
  for (const auto& [threads, isa] : thread_and_isa_runs()) {
    const IsaScope as_isa(isa);
    CpuBackend be(threads);
    DeviceTensor gamma(be, DType::fp32, Shape{n}, gv), beta(be, DType::fp32, Shape{n}, beta_v);
    for (const DType dt : kDtypes)
      for (const DType yt : {DType::fp32, dt}) {
        const std::string what = isa_name(isa) + ", threads " + std::to_string(threads) + ", " +
                                 std::string(sdk::dtype_name(dt)) + " -> " +
                                 std::string(sdk::dtype_name(yt));
        const Shape shape{rows, n};
        DeviceTensor a(be, dt, shape, av), b(be, dt, shape, bv);
        // Apart: the residual facet's add, then the layer norm of its stored sum.
        DeviceTensor sum_apart(be, dt, shape), y_apart(be, yt, shape);
        DeviceTensor m_apart(be, DType::fp32, Shape{rows}), r_apart(be, DType::fp32, Shape{rows});
        const sdk::TensorView ab[2] = {a.view(), b.view()};
        sdk::facet<sdk::ResidualFacet>(be)->add(ab, false, sum_apart);
        sdk::facet<sdk::LayerNormFacet>(be)->layernorm_forward(sum_apart, gamma, beta, 1e-5f,
                                                               y_apart, m_apart, r_apart);
        // Fused, the sum apart and then in place of a.
        for (const bool in_place : {false, true}) {
          DeviceTensor sum(be, dt, shape), y(be, yt, shape);
          DeviceTensor mean(be, DType::fp32, Shape{rows}), rstd(be, DType::fp32, Shape{rows});
          DeviceTensor a2(be, dt, shape, av);
          sdk::LayerNormAddArgs args;
          args.a = a2.view();
          args.b = b.view();
          args.sum = in_place ? a2.view() : sum.view();
          args.gamma = gamma.view();
          args.beta = beta.view();
          args.y = y.view();
          args.mean = mean.view();
          args.rstd = rstd.view();
          sdk::facet<sdk::LayerNormFacet>(be)->layernorm_add_forward(args);
          const std::string how = what + (in_place ? ", sum in a" : "");
          EXPECT_EQ(in_place ? a2.get() : sum.get(), sum_apart.get()) << how;
          EXPECT_EQ(y.get(), y_apart.get()) << how;
          EXPECT_EQ(mean.get(), m_apart.get()) << how;
          EXPECT_EQ(rstd.get(), r_apart.get()) << how;
        }
      }
  }
}

// The backward on every ISA variant, one and two threads, and every storage of x and dy (dx in
// their storage or fp32), typed kernels and the row path alike: for the same values the same
// bits (dx rounded once into its storage), a double reference within fp32's rounding, and
// layernorm_backward_accumulate the fp32 sum plus that dx.
TEST(BackendCpuLayerNorm, TheBackwardIsTheSameBitsOnEveryPathAndMatchesADoubleReference) {
  for (const std::int64_t n : {9, 131}) {
    const std::int64_t rows = 40000 / n + 3;
    const auto xv = exact_values(static_cast<std::size_t>(rows * n), 51);
    // dy: multiples of 1/64 in [-1, 1], exact in every storage.
    auto gv = random_values(static_cast<std::size_t>(rows * n), 52, -1.0f, 1.0f);
    for (float& v : gv) v = std::round(v * 64.0f) / 64.0f;
    const auto wv = random_values(static_cast<std::size_t>(n), 53, 0.5f, 1.5f);
    const auto sv = random_values(static_cast<std::size_t>(rows * n), 54, -4.0f, 4.0f);
    // The reference, from the forward's fp32 mean and rstd.
    std::optional<Outputs> first;  // dx, dgamma, dbeta of the first run
    std::vector<double> want_dx, want_dgamma(static_cast<std::size_t>(n)), want_dbeta(want_dgamma);
    for (const auto& [threads, isa] : thread_and_isa_runs()) {
      const IsaScope as_isa(isa);
      CpuBackend be(threads);
      auto* norm = sdk::facet<sdk::LayerNormFacet>(be);
      DeviceTensor gamma(be, DType::fp32, Shape{n}, wv), beta(be, DType::fp32, Shape{n});
      for (const DType xt : kDtypes)
        for (const DType dxt : {xt, DType::fp32}) {
          const std::string what = isa_name(isa) + ", threads " + std::to_string(threads) + ", n " +
                                   std::to_string(n) + ", x and dy " +
                                   std::string(sdk::dtype_name(xt)) + ", dx " +
                                   std::string(sdk::dtype_name(dxt));
          DeviceTensor x(be, xt, Shape{rows, n}, xv), dy(be, xt, Shape{rows, n}, gv);
          DeviceTensor y(be, DType::fp32, Shape{rows, n});
          DeviceTensor mean(be, DType::fp32, Shape{rows}), rstd(be, DType::fp32, Shape{rows});
          norm->layernorm_forward(x, gamma, beta, 1e-5f, y, mean, rstd);
          DeviceTensor dx(be, dxt, Shape{rows, n});
          DeviceTensor dgamma(be, DType::fp32, Shape{n}), dbeta(be, DType::fp32, Shape{n});
          norm->layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, false);
          const Outputs got{dx.get(), dgamma.get(), dbeta.get()};
          if (!first) {
            first = got;
            const auto m = mean.get(), r = rstd.get();
            want_dx.resize(xv.size());
            for (std::int64_t i = 0; i < rows; ++i) {
              double sg = 0.0, sgx = 0.0;
              for (std::int64_t j = 0; j < n; ++j) {
                const double xhat = (xv[i * n + j] - m[i]) * static_cast<double>(r[i]);
                const double g = static_cast<double>(gv[i * n + j]) * wv[j];
                sg += g;
                sgx += g * xhat;
                want_dgamma[j] += gv[i * n + j] * xhat;
                want_dbeta[j] += gv[i * n + j];
              }
              for (std::int64_t j = 0; j < n; ++j) {
                const double xhat = (xv[i * n + j] - m[i]) * static_cast<double>(r[i]);
                want_dx[i * n + j] =
                    r[i] * (static_cast<double>(gv[i * n + j]) * wv[j] - sg / n - xhat * sgx / n);
              }
            }
            EXPECT_LE(relative_error(got.y, want_dx), 1e-5) << what;
            EXPECT_LE(relative_error(got.mean, want_dgamma), 1e-5) << what;
            EXPECT_LE(relative_error(got.rstd, want_dbeta), 1e-6) << what;
          }
          std::vector<float> dx_stored = first->y;
          for (float& v : dx_stored) v = stored_value(v, dxt);
          EXPECT_EQ(got.y, dx_stored) << what;
          EXPECT_EQ(got.mean, first->mean) << what;
          EXPECT_EQ(got.rstd, first->rstd) << what;
          // Accumulated: the fp32 sum plus the fp32 dx, one rounding each.
          DeviceTensor sum(be, DType::fp32, Shape{rows, n}, sv);
          DeviceTensor dg2(be, DType::fp32, Shape{n}), db2(be, DType::fp32, Shape{n});
          norm->layernorm_backward_accumulate(dy, x, gamma, mean, rstd, sum, dg2, db2, false);
          std::vector<float> want_sum = sv;
          for (std::size_t i = 0; i < want_sum.size(); ++i) want_sum[i] += first->y[i];
          EXPECT_EQ(sum.get(), want_sum) << what;
          EXPECT_EQ(dg2.get(), first->mean) << what;
        }
    }
  }
}

// On two threads: without dgamma or dbeta (a frozen parameter), with dgamma and dbeta accumulated
// into what they hold, and with dx written over dy: the same dx, and the wanted gradients the
// plain call's (plus what they held).
TEST(BackendCpuLayerNorm, TheBackwardsOptionalGradientsAccumulationAndInPlaceOnTwoThreads) {
  const std::int64_t rows = 700, n = 96;  // rows·n past parallel_worth
  const auto xv = random_values(static_cast<std::size_t>(rows * n), 61, -2.0f, 2.0f);
  const auto gv = random_values(static_cast<std::size_t>(rows * n), 62, -1.0f, 1.0f);
  const auto wv = random_values(static_cast<std::size_t>(n), 63, 0.5f, 1.5f);
  const auto held = random_values(static_cast<std::size_t>(n), 64, -1.0f, 1.0f);
  CpuBackend be(2);
  auto* norm = sdk::facet<sdk::LayerNormFacet>(be);
  for (const DType dt : kDtypes) {
    const std::string what(sdk::dtype_name(dt));
    DeviceTensor x(be, dt, Shape{rows, n}, xv), dy(be, dt, Shape{rows, n}, gv);
    DeviceTensor gamma(be, DType::fp32, Shape{n}, wv), beta(be, DType::fp32, Shape{n});
    DeviceTensor y(be, dt, Shape{rows, n});
    DeviceTensor mean(be, DType::fp32, Shape{rows}), rstd(be, DType::fp32, Shape{rows});
    norm->layernorm_forward(x, gamma, beta, 1e-5f, y, mean, rstd);
    DeviceTensor dx(be, dt, Shape{rows, n});
    DeviceTensor dgamma(be, DType::fp32, Shape{n}), dbeta(be, DType::fp32, Shape{n});
    norm->layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, false);
    for (const int without : {0, 1}) {
      DeviceTensor dx2(be, dt, Shape{rows, n}), grad(be, DType::fp32, Shape{n});
      norm->layernorm_backward(dy, x, gamma, mean, rstd, dx2, without == 0 ? TensorView{} : grad,
                               without == 1 ? TensorView{} : grad, false);
      EXPECT_EQ(dx2.get(), dx.get()) << what << ", without " << (without == 0 ? "dgamma" : "dbeta");
      EXPECT_EQ(grad.get(), without == 0 ? dbeta.get() : dgamma.get()) << what;
    }
    DeviceTensor dg2(be, DType::fp32, Shape{n}, held), db2(be, DType::fp32, Shape{n}, held);
    DeviceTensor dy2(be, dt, Shape{rows, n}, gv);
    norm->layernorm_backward(dy2, x, gamma, mean, rstd, dy2, dg2, db2, true);  // dx over dy
    EXPECT_EQ(dy2.get(), dx.get()) << what << ", in place";
    const auto dg = dgamma.get(), db = dbeta.get(), g2 = dg2.get(), b2 = db2.get();
    for (std::int64_t j = 0; j < n; ++j) {
      EXPECT_NEAR(g2[j], held[j] + dg[j], 1e-5 * (1.0 + std::abs(dg[j]))) << what << " " << j;
      EXPECT_NEAR(b2[j], held[j] + db[j], 1e-5 * (1.0 + std::abs(db[j]))) << what << " " << j;
    }
  }
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
