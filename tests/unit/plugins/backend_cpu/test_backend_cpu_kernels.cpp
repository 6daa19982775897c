// Layer kernels against double references; backward passes against central finite differences
// of the double forward; the ISA variants' limit; memory statistics and capabilities.
#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>

#include "backend_test_util.h"
#include "isa_variants.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::backend_cpu::testing {
namespace {

double gelu_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double relu_ref(double x) {
  return x > 0.0 ? x : 0.0;
}

// d/dx of f at x by central differences (f is smooth where it is evaluated).
double central_diff(const std::function<double(double)>& f, double x, double h = 1e-5) {
  return (f(x + h) - f(x - h)) / (2.0 * h);
}

TEST(backend_cpu_kernels, BiasGrad) {
  CpuBackend be(2);
  const std::int64_t rows = 7, n = 13;
  const auto y0 = random_values(static_cast<std::size_t>(rows * n), 1);
  const auto bias = random_values(static_cast<std::size_t>(n), 2);
  for (DType dt : {DType::fp32, DType::bf16, DType::fp16}) {
    const auto yv = representable(y0, dt);
    DeviceTensor y(be, dt, {rows, n}, yv);
    DeviceTensor db(be, DType::fp32, {n}, bias);
    sdk::facet<sdk::ActivationFacet>(be)->bias_grad(y, db, /*accumulate=*/true);
    const auto ydev = y.get();
    std::vector<double> sums(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < ydev.size(); ++i) sums[i % static_cast<std::size_t>(n)] += ydev[i];
    std::vector<double> accumulated(sums);
    for (std::size_t j = 0; j < sums.size(); ++j) accumulated[j] += bias[j];
    expect_close(db.get(), accumulated, 1e-6, 1e-6, "bias_grad accumulate");
    sdk::facet<sdk::ActivationFacet>(be)->bias_grad(y, db, /*accumulate=*/false);
    expect_close(db.get(), sums, 1e-6, 1e-6, "bias_grad overwrite");
  }
}

// The contract's order, bit for bit: each column's rows added in order in double, then the old
// value when accumulating, rounded once to fp32. Columns in whole blocks of 64 and a partial one,
// enough elements for the OpenMP team, fp32 / bf16 (decoded in the loop) and fp16 (decoded in
// chunks), on one thread and two.
TEST(backend_cpu_kernels, BiasGradAddsEachColumnsRowsInOrderInDouble) {
  const std::int64_t rows = 300, n = 200;
  const auto y0 = random_values(static_cast<std::size_t>(rows * n), 5, -3.0f, 3.0f);
  const auto bias = random_values(static_cast<std::size_t>(n), 6);
  for (const int threads : {1, 2}) {
    CpuBackend be(threads);
    for (DType dt : {DType::fp32, DType::bf16, DType::fp16}) {
      DeviceTensor y(be, dt, {rows, n}, representable(y0, dt));
      const auto yv = y.get();
      for (const bool accumulate : {false, true}) {
        DeviceTensor db(be, DType::fp32, {n}, bias);
        sdk::facet<sdk::ActivationFacet>(be)->bias_grad(y, db, accumulate);
        const auto got = db.get();
        for (std::int64_t j = 0; j < n; ++j) {
          double sum = 0.0;
          for (std::int64_t r = 0; r < rows; ++r)
            sum += static_cast<double>(yv[static_cast<std::size_t>(r * n + j)]);
          const double before = accumulate ? bias[static_cast<std::size_t>(j)] : 0.0;
          ASSERT_EQ(got[static_cast<std::size_t>(j)], static_cast<float>(before + sum))
              << sdk::dtype_name(dt) << ", " << threads << " threads, accumulate " << accumulate
              << ", column " << j;
        }
      }
    }
  }
}

TEST(backend_cpu_kernels, ActivationsForwardAndBackwardAgainstFiniteDifferences) {
  CpuBackend be(2);
  const std::int64_t rows = 7, n = 13;
  auto xv = random_values(static_cast<std::size_t>(rows * n), 3, -4.0f, 4.0f);
  for (auto& x : xv)
    if (std::fabs(x) < 1e-3f) x = 0.5f;  // keep relu's kink away from the difference stencil
  const auto dyv = random_values(xv.size(), 4);
  for (auto act : {sdk::Activation::relu, sdk::Activation::gelu}) {
    const std::function<double(double)> f = act == sdk::Activation::relu ? relu_ref : gelu_ref;
    for (DType dt : {DType::fp32, DType::bf16, DType::fp16}) {
      const auto x_in = representable(xv, dt);
      const auto dy_in = representable(dyv, dt);
      const double rel = dt == DType::fp32 ? 1e-5 : (dt == DType::bf16 ? 0x1p-7 : 0x1p-10);
      DeviceTensor x(be, dt, {rows, n}, x_in);
      DeviceTensor y(be, dt, {rows, n});
      sdk::facet<sdk::ActivationFacet>(be)->activation_forward(act, x, y);
      std::vector<double> expected(x_in.size()), grad(x_in.size());
      for (std::size_t i = 0; i < x_in.size(); ++i) {
        expected[i] = f(x_in[i]);
        grad[i] = dy_in[i] * central_diff(f, x_in[i]);
      }
      expect_close(y.get(), expected, rel, 1e-5, "activation_forward");
      DeviceTensor dy(be, dt, {rows, n}, dy_in);
      DeviceTensor dx(be, dt, {rows, n});
      sdk::facet<sdk::ActivationFacet>(be)->activation_backward(act, x, dy, dx);
      expect_close(dx.get(), grad, rel, 1e-4, "activation_backward");
      // In place: dx aliases dy, y aliases x.
      sdk::facet<sdk::ActivationFacet>(be)->activation_backward(act, x, dy, dy);
      expect_close(dy.get(), grad, rel, 1e-4, "activation_backward in place");
      sdk::facet<sdk::ActivationFacet>(be)->activation_forward(act, x, x);
      expect_close(x.get(), expected, rel, 1e-5, "activation_forward in place");
    }
  }
  // Mixed storage (bf16 in, fp32 out) takes the portable path.
  DeviceTensor x(be, DType::bf16, {3}, {-1.0f, 0.5f, 2.0f});
  DeviceTensor y(be, DType::fp32, {3});
  sdk::facet<sdk::ActivationFacet>(be)->activation_forward(sdk::Activation::gelu, x, y);
  expect_close(y.get(), {gelu_ref(-1.0), gelu_ref(0.5), gelu_ref(2.0)}, 1e-6, 1e-6, "mixed");
}

// Double layernorm forward of one row, for references and finite differences.
std::vector<double> layernorm_ref(const std::vector<double>& x, const std::vector<double>& g,
                                  const std::vector<double>& b, double eps,
                                  double* mean_out = nullptr, double* rstd_out = nullptr) {
  const auto n = static_cast<double>(x.size());
  double mean = 0.0;
  for (double v : x) mean += v;
  mean /= n;
  double var = 0.0;
  for (double v : x) var += (v - mean) * (v - mean);
  var /= n;
  const double rstd = 1.0 / std::sqrt(var + eps);
  if (mean_out) *mean_out = mean;
  if (rstd_out) *rstd_out = rstd;
  std::vector<double> y(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) y[j] = (x[j] - mean) * rstd * g[j] + b[j];
  return y;
}

TEST(backend_cpu_kernels, LayerNormForwardAndBackwardAgainstFiniteDifferences) {
  CpuBackend be(2);
  const std::int64_t rows = 7, n = 13;
  const double eps = 1e-5;
  const auto xv = random_values(static_cast<std::size_t>(rows * n), 5, -2.0f, 3.0f);
  const auto gv = random_values(static_cast<std::size_t>(n), 6, 0.5f, 1.5f);
  const auto bv = random_values(static_cast<std::size_t>(n), 7);
  const auto dyv = random_values(xv.size(), 8);
  DeviceTensor x(be, DType::fp32, {rows, n}, xv);
  DeviceTensor gamma(be, DType::fp32, {n}, gv);
  DeviceTensor beta(be, DType::fp32, {n}, bv);
  DeviceTensor y(be, DType::fp32, {rows, n});
  DeviceTensor mean(be, DType::fp32, {rows});
  DeviceTensor rstd(be, DType::fp32, {rows});
  sdk::facet<sdk::LayerNormFacet>(be)->layernorm_forward(x, gamma, beta, static_cast<float>(eps), y,
                                                         mean, rstd);

  const std::vector<double> g(gv.begin(), gv.end()), b(bv.begin(), bv.end());
  std::vector<double> y_ref, mean_ref, rstd_ref, dx_ref, dgamma_ref(static_cast<std::size_t>(n)),
      dbeta_ref(static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto off = static_cast<std::size_t>(r * n);
    std::vector<double> row(
        xv.begin() + static_cast<std::ptrdiff_t>(off),
        xv.begin() + static_cast<std::ptrdiff_t>(off + static_cast<std::size_t>(n)));
    double mu = 0.0, rs = 0.0;
    const auto yr = layernorm_ref(row, g, b, eps, &mu, &rs);
    y_ref.insert(y_ref.end(), yr.begin(), yr.end());
    mean_ref.push_back(mu);
    rstd_ref.push_back(rs);
    // L = sum_j dy_j * y_j; dL/dx by central differences of the double forward.
    auto loss = [&](const std::vector<double>& xs, const std::vector<double>& gs,
                    const std::vector<double>& bs) {
      const auto ys = layernorm_ref(xs, gs, bs, eps);
      double l = 0.0;
      for (std::size_t j = 0; j < ys.size(); ++j) l += dyv[off + j] * ys[j];
      return l;
    };
    const double h = 1e-6;
    for (std::size_t j = 0; j < row.size(); ++j) {
      auto xp = row, xm = row;
      xp[j] += h;
      xm[j] -= h;
      dx_ref.push_back((loss(xp, g, b) - loss(xm, g, b)) / (2 * h));
      auto gp = g, gm = g;
      gp[j] += h;
      gm[j] -= h;
      dgamma_ref[j] += (loss(row, gp, b) - loss(row, gm, b)) / (2 * h);
      auto bp = b, bm = b;
      bp[j] += h;
      bm[j] -= h;
      dbeta_ref[j] += (loss(row, g, bp) - loss(row, g, bm)) / (2 * h);
    }
  }
  expect_close(y.get(), y_ref, 1e-5, 1e-5, "layernorm y");
  expect_close(mean.get(), mean_ref, 1e-6, 1e-6, "layernorm mean");
  expect_close(rstd.get(), rstd_ref, 1e-5, 1e-6, "layernorm rstd");

  DeviceTensor dy(be, DType::fp32, {rows, n}, dyv);
  DeviceTensor dx(be, DType::fp32, {rows, n});
  DeviceTensor dgamma(be, DType::fp32, {n});
  DeviceTensor dbeta(be, DType::fp32, {n});
  sdk::facet<sdk::LayerNormFacet>(be)->layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma,
                                                          dbeta, false);
  expect_close(dx.get(), dx_ref, 1e-4, 1e-4, "layernorm dx");
  expect_close(dgamma.get(), dgamma_ref, 1e-4, 1e-4, "layernorm dgamma");
  expect_close(dbeta.get(), dbeta_ref, 1e-4, 1e-4, "layernorm dbeta");
  // Accumulation adds to what is there.
  sdk::facet<sdk::LayerNormFacet>(be)->layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma,
                                                          dbeta, true);
  std::vector<double> twice(dgamma_ref);
  for (auto& v : twice) v *= 2.0;
  expect_close(dgamma.get(), twice, 1e-4, 1e-4, "layernorm dgamma accumulated");

  // bf16 activations with fp32 statistics.
  DeviceTensor x16(be, DType::bf16, {rows, n}, xv);
  DeviceTensor y16(be, DType::bf16, {rows, n});
  sdk::facet<sdk::LayerNormFacet>(be)->layernorm_forward(x16, gamma, beta, static_cast<float>(eps),
                                                         y16, mean, rstd);
  std::vector<double> y16_ref;
  const auto x16v = x16.get();
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto off = static_cast<std::ptrdiff_t>(r * n);
    std::vector<double> row(x16v.begin() + off, x16v.begin() + off + n);
    const auto yr = layernorm_ref(row, g, b, eps);
    y16_ref.insert(y16_ref.end(), yr.begin(), yr.end());
  }
  expect_close(y16.get(), y16_ref, 0x1p-8, 1e-3, "layernorm bf16 y");
}

TEST(backend_cpu_kernels, SixteenBitStorageMatchesFp32OnRepresentableInputs) {
  // Kernels compute in fp32 whatever the storage: on inputs exactly representable in bf16, the
  // bf16 results are the fp32 results rounded once.
  CpuBackend be(2);
  const std::int64_t rows = 5, n = 9;
  const auto xv = representable(random_values(static_cast<std::size_t>(rows * n), 31, -3.0f, 3.0f),
                                DType::bf16);
  const auto dyv = representable(random_values(xv.size(), 32), DType::bf16);
  std::vector<float> labels = {1, 8, 0, 4, 4};
  DeviceTensor lab(be, DType::int32, {rows}, labels);
  DeviceTensor loss32(be, DType::fp32, {1}), loss16(be, DType::fp32, {1});
  DeviceTensor z32(be, DType::fp32, {rows, n}, xv), z16(be, DType::bf16, {rows, n}, xv);
  DeviceTensor d32(be, DType::fp32, {rows, n}), d16(be, DType::bf16, {rows, n});
  sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(z32, lab, 1.0f, 0.0f, loss32, {}, d32);
  sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(z16, lab, 1.0f, 0.0f, loss16, {}, d16);
  EXPECT_EQ(loss16.get()[0], loss32.get()[0]);
  const auto d32v = d32.get();
  const auto d16v = d16.get();
  for (std::size_t i = 0; i < d32v.size(); ++i)
    ASSERT_EQ(d16v[i], bf16_to_float(float_to_bf16(d32v[i]))) << i;

  DeviceTensor mean(be, DType::fp32, {rows}), rstd(be, DType::fp32, {rows});
  DeviceTensor y32(be, DType::fp32, {rows, n});
  sdk::facet<sdk::LayerNormFacet>(be)->layernorm_forward(z32, {}, {}, 1e-5f, y32, mean, rstd);
  DeviceTensor dy32(be, DType::fp32, {rows, n}, dyv), dy16(be, DType::bf16, {rows, n}, dyv);
  DeviceTensor dx32(be, DType::fp32, {rows, n}), dx16(be, DType::fp16, {rows, n});
  DeviceTensor dg32(be, DType::fp32, {n}), dg16(be, DType::fp32, {n});
  sdk::facet<sdk::LayerNormFacet>(be)->layernorm_backward(dy32, z32, {}, mean, rstd, dx32, dg32, {},
                                                          false);
  sdk::facet<sdk::LayerNormFacet>(be)->layernorm_backward(dy16, z16, {}, mean, rstd, dx16, dg16, {},
                                                          false);
  const auto dx32v = dx32.get();
  const auto dx16v = dx16.get();
  for (std::size_t i = 0; i < dx32v.size(); ++i)
    ASSERT_EQ(dx16v[i], fp16_to_float(float_to_fp16(dx32v[i]))) << i;
  EXPECT_EQ(dg16.get(), dg32.get());

  std::vector<TensorView> t16 = {z16};
  std::vector<TensorView> t32 = {z32};
  EXPECT_EQ(be.sum_of_squares(t16), be.sum_of_squares(t32));
}

TEST(backend_cpu_kernels, FillMulScalarAxpy) {
  CpuBackend be(2);
  DeviceTensor x(be, DType::fp32, {5, 3});
  be.fill(x, 1.5f);
  EXPECT_EQ(x.get(), std::vector<float>(15, 1.5f));
  const sdk::TensorView xs[] = {x};
  sdk::facet<sdk::ForeachFacet>(be)->foreach_mul_scalar(xs, -2.0f);
  EXPECT_EQ(x.get(), std::vector<float>(15, -3.0f));
  DeviceTensor h(be, DType::fp16, {5, 3});
  be.fill(h, 0.1f);
  EXPECT_EQ(h.get()[14], fp16_to_float(float_to_fp16(0.1f)));
  const auto yv = random_values(15, 10);
  DeviceTensor y(be, DType::fp32, {5, 3}, yv);
  sdk::facet<sdk::ActivationFacet>(be)->axpy(0.25f, h, y);
  std::vector<double> expected(15);
  for (std::size_t i = 0; i < 15; ++i)
    expected[i] = yv[i] + 0.25 * fp16_to_float(float_to_fp16(0.1f));
  expect_close(y.get(), expected, 1e-7, 1e-7, "axpy");
  DeviceTensor wrong(be, DType::fp32, {4});
  EXPECT_THROW(sdk::facet<sdk::ActivationFacet>(be)->axpy(1.0f, wrong, y), sdk::BackendError);
  // An int32 fill is toward zero and saturating, NaN 0 (the CUDA backend's rule).
  DeviceTensor ids(be, DType::int32, {1});
  const std::pair<float, std::int32_t> cases[] = {{-7.9f, -7},
                                                  {3.0e9f, INT32_MAX},
                                                  {-INFINITY, INT32_MIN},
                                                  {NAN, 0},
                                                  {2147483520.0f, 2147483520}};
  for (const auto& [value, want] : cases) {
    be.fill(ids, value);
    std::int32_t got = 1;
    be.copy_to_host(&got, ids);
    EXPECT_EQ(got, want) << value;
  }
}

// `v` rounded once (RNE) into `t`'s storage, as the SDK encodes.
float stored_as(DType t, float v) {
  if (t == DType::bf16) return sdk::decode_bf16(sdk::encode_bf16(v));
  if (t == DType::fp16) return sdk::decode_fp16(sdk::encode_fp16(v));
  return v;
}

// add: the residual join in one pass. The sum is FP32 and rounded once into y (bit for bit the
// SDK's encode of the exact FP32 sum), the ReLU keeps NaN (as activation_forward does), y may be
// an input, and a large tensor (two threads over chunks) follows the same rule.
TEST(backend_cpu_kernels, AddSumsInFp32RoundsOnceAndKeepsNaN) {
  CpuBackend be(2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const std::int64_t n : {std::int64_t{37}, std::int64_t{70001}})
    for (const bool relu : {false, true})
      for (const DType out : {DType::fp32, DType::bf16, DType::fp16}) {
        const std::string what =
            std::string(sdk::dtype_name(out)) + (relu ? " relu" : "") + ", n " + std::to_string(n);
        auto av = random_values(static_cast<std::size_t>(n), 1, -3.0f, 3.0f);
        auto bv = random_values(static_cast<std::size_t>(n), 2, -3.0f, 3.0f);
        const auto cv = random_values(static_cast<std::size_t>(n), 3, -1.0f, 1.0f);
        av[3] = nan;
        bv[5] = std::numeric_limits<float>::infinity();
        av[6] = -0.0f;
        bv[6] = -0.0f;
        DeviceTensor a(be, out, Shape{n}, av), b(be, DType::bf16, Shape{n}, bv),
            c(be, DType::fp32, Shape{n}, cv), y(be, out, Shape{n});
        const auto ad = a.get(), bd = b.get(), cd = c.get();  // the values as stored
        auto expected = [&](std::size_t i, bool three) {
          float sum = ad[i] + bd[i];
          if (three) sum += cd[i];
          if (relu && sum < 0.0f) sum = 0.0f;
          return stored_as(out, sum);
        };
        auto expect_all = [&](const std::vector<float>& got, bool three, const std::string& how) {
          for (std::size_t i = 0; i < got.size(); ++i) {
            const float w = expected(i, three);
            if (std::isnan(w)) {
              ASSERT_TRUE(std::isnan(got[i])) << how << ", element " << i;
            } else {
              ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(w))
                  << how << ", element " << i << ": " << got[i] << " vs " << w;
            }
          }
        };
        const sdk::TensorView three[] = {a, b, c};
        sdk::facet<sdk::ResidualFacet>(be)->add(three, relu, y);
        expect_all(y.get(), true, what);
        const sdk::TensorView two[] = {a, b};
        sdk::facet<sdk::ResidualFacet>(be)->add(two, relu, a);  // in place: y is the first input
        expect_all(a.get(), false, what + " in place");
      }
  DeviceTensor x(be, DType::fp32, Shape{4}), z(be, DType::fp32, Shape{4}),
      short_y(be, DType::fp32, Shape{3});
  const sdk::TensorView one[] = {x};
  EXPECT_THROW(sdk::facet<sdk::ResidualFacet>(be)->add(one, false, z), sdk::BackendError);
  const sdk::TensorView two[] = {x, z};
  EXPECT_THROW(sdk::facet<sdk::ResidualFacet>(be)->add(two, false, short_y), sdk::BackendError);
  EXPECT_TRUE(sdk::facet<sdk::ResidualFacet>(be)->supports(
      sdk::ResidualOp::add, std::vector<DType>{DType::bf16, DType::fp32}));
  EXPECT_FALSE(sdk::facet<sdk::ResidualFacet>(be)->supports(
      sdk::ResidualOp::add, std::vector<DType>{DType::fp8_e4m3, DType::fp32}));
}

TEST(backend_cpu_isa, LimitNarrowsTheKernelVariantsAndLiftingItRestoresTheCpus) {
  // What the ISA-looping tests rely on: a limit is obeyed, never widened past the CPU, and lifted.
  const Isa cpu = detected_isa();
  EXPECT_EQ(best_isa(), cpu);
  EXPECT_EQ(limit_isa(Isa::baseline), Isa::baseline);
  EXPECT_EQ(best_isa(), Isa::baseline);
  EXPECT_EQ(limit_isa(Isa::v3), std::max(cpu, Isa::v3));
  EXPECT_EQ(limit_isa(Isa::v4), cpu);
  EXPECT_EQ(runnable_isas().front(), cpu);
  EXPECT_EQ(runnable_isas().back(), Isa::baseline);
}

TEST(backend_cpu_memory, StatsTrackCurrentPeakAndLiveCount) {
  CpuBackend be(1);
  EXPECT_EQ(be.memory_stats().current_bytes, 0u);
  void* a = be.allocate(100);
  void* b = be.allocate(1000);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % 64, 0u);
  auto s = be.memory_stats();
  EXPECT_EQ(s.current_bytes, 1100u);
  EXPECT_EQ(s.peak_bytes, 1100u);
  EXPECT_EQ(s.allocations, 2u);
  be.deallocate(b);
  s = be.memory_stats();
  EXPECT_EQ(s.current_bytes, 100u);
  EXPECT_EQ(s.peak_bytes, 1100u);
  EXPECT_EQ(s.allocations, 1u);
  be.deallocate(nullptr);
  be.deallocate(a);
  EXPECT_EQ(be.memory_stats().current_bytes, 0u);
  EXPECT_EQ(be.memory_stats().allocations, 0u);
  EXPECT_THROW(be.allocate(std::numeric_limits<std::size_t>::max() / 2), sdk::BackendError);
}

TEST(backend_cpu_memory, CopiesRoundTrip) {
  CpuBackend be(1);
  const auto v = random_values(33, 12);
  DeviceTensor a(be, DType::fp32, {3, 11});
  DeviceTensor b(be, DType::fp32, {33});
  be.copy_from_host(a, v.data());
  be.copy(b, a);
  std::vector<float> back(33);
  be.copy_to_host(back.data(), b);
  EXPECT_EQ(back, v);
  DeviceTensor h(be, DType::fp16, {33});
  EXPECT_THROW(be.copy(h, a), sdk::BackendError);
}

TEST(backend_cpu_capabilities, ReportsKindThreadsAndHonestGemmSupport) {
  CpuBackend be(2);
  const auto caps = be.capabilities();
  EXPECT_EQ(caps.kind, "cpu");
  EXPECT_EQ(caps.threads, 2);
  EXPECT_NE(caps.device_name.find("2 threads"), std::string::npos) << caps.device_name;
  EXPECT_GT(caps.memory_bytes, 0u);
  EXPECT_TRUE(caps.native(DType::fp32));
  EXPECT_NE(caps.find(DType::fp32)->how.find("oneDNN"), std::string::npos);
  EXPECT_TRUE(caps.supports(DType::tf32));
  EXPECT_FALSE(caps.native(DType::tf32));
  // Every floating dtype is accepted; only fp32 and (where oneDNN runs it) bf16 are native.
  for (DType t :
       {DType::fp32, DType::tf32, DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2}) {
    ASSERT_TRUE(caps.supports(t)) << sdk::dtype_name(t);
    const std::string& how = caps.find(t)->how;
    EXPECT_FALSE(how.empty());
    if (!caps.native(t)) {
      EXPECT_NE(how.find("emulated"), std::string::npos) << sdk::dtype_name(t) << ": " << how;
    }
  }
  EXPECT_FALSE(caps.supports(DType::int32));
  for (DType t : {DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2}) EXPECT_FALSE(caps.native(t));
  // bf16 native exactly when oneDNN's bf16 matmul is chosen, and then the kernel is named.
  if (caps.native(DType::bf16)) {
    EXPECT_NE(caps.find(DType::bf16)->how.find("oneDNN bf16 matmul ("), std::string::npos);
  }
  EXPECT_FALSE(CpuBackend(1, Bf16GemmPath::emulated).capabilities().native(DType::bf16));
  EXPECT_FALSE(caps.features.empty());
  EXPECT_NE(std::find(caps.features.begin(), caps.features.end(), "sse2"), caps.features.end());
  EXPECT_EQ(CpuBackend(0).threads() >= 1, true);
  EXPECT_THROW(CpuBackend(-1), sdk::BackendError);
}

// flush_denormals: while the backend lives, a subnormal operand is 0 on every thread of its team
// (the tensor is large enough to be split among them), as with torch.set_flush_denormal(True);
// before and after, subnormals are computed exactly.
TEST(backend_cpu_kernels, FlushDenormalsZeroesSubnormalsOnEveryThreadWhileTheBackendLives) {
  if (!DenormalFlush::supported()) GTEST_SKIP() << "no flush-to-zero control on this CPU";
  const float tiny = 1e-39f;  // below fp32's smallest normal, 2^-126
  ASSERT_EQ(std::fpclassify(tiny), FP_SUBNORMAL);
  const std::int64_t n = 1 << 18;
  auto axpy_of_tiny = [&](CpuBackend& be) {
    DeviceTensor x(be, DType::fp32, {n}, std::vector<float>(static_cast<std::size_t>(n), tiny));
    DeviceTensor y(be, DType::fp32, {n});
    sdk::facet<sdk::ActivationFacet>(be)->axpy(2.0f, x, y);
    return y.get();
  };
  auto count = [](const std::vector<float>& v, float value) {
    return std::count(v.begin(), v.end(), value);
  };
  {
    CpuBackend plain(2);
    EXPECT_FALSE(plain.flushes_denormals());
    EXPECT_EQ(count(axpy_of_tiny(plain), 2.0f * tiny), n);
  }
  {
    CpuBackend flushing(2);
    flushing.flush_denormals();
    EXPECT_TRUE(flushing.flushes_denormals());
    EXPECT_EQ(count(axpy_of_tiny(flushing), 0.0f), n);
  }
  CpuBackend after(2);
  EXPECT_EQ(count(axpy_of_tiny(after), 2.0f * tiny), n);
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
