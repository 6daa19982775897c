// Batch norm against double-precision references: training, inference and backward, the split
// ops of synchronized batch norm, a cancelling channel's sums, the fused residual add, and the
// join's backward.
#include "conformance_fixture.h"

namespace mixtrain::conformance {
namespace internal {
void link_batch_norm() {}  // see link_all_test_files()
}  // namespace internal

namespace {

using namespace internal;

struct BatchNormReference {
  std::vector<double> mean, var, y, dx, dgamma, dbeta;
};
BatchNormReference naive_batchnorm(std::int64_t rows, std::int64_t c, double eps, bool relu,
                                   const std::vector<double>& x, const std::vector<double>* gamma,
                                   const std::vector<double>* beta,
                                   const std::vector<double>* use_mean,
                                   const std::vector<double>* use_var,
                                   const std::vector<double>& dy) {
  BatchNormReference r;
  const auto C = static_cast<std::size_t>(c);
  r.mean.assign(C, 0.0);
  r.var.assign(C, 0.0);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < C; ++j)
      r.mean[j] += x[static_cast<std::size_t>(i) * C + j] / static_cast<double>(rows);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < C; ++j) {
      const double d = x[static_cast<std::size_t>(i) * C + j] - r.mean[j];
      r.var[j] += d * d / static_cast<double>(rows);
    }
  const auto& m = use_mean != nullptr ? *use_mean : r.mean;
  const auto& v = use_var != nullptr ? *use_var : r.var;
  r.y.assign(x.size(), 0.0);
  r.dx.assign(x.size(), 0.0);
  r.dgamma.assign(C, 0.0);
  r.dbeta.assign(C, 0.0);
  std::vector<double> g_masked(x.size(), 0.0), xhat(x.size(), 0.0);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < C; ++j) {
      const std::size_t k = static_cast<std::size_t>(i) * C + j;
      xhat[k] = (x[k] - m[j]) / std::sqrt(v[j] + eps);
      const double bn = xhat[k] * (gamma ? (*gamma)[j] : 1.0) + (beta ? (*beta)[j] : 0.0);
      r.y[k] = relu ? std::max(bn, 0.0) : bn;
      if (!dy.empty()) g_masked[k] = relu && bn <= 0.0 ? 0.0 : dy[k];
    }
  if (dy.empty()) return r;
  for (std::size_t k = 0; k < x.size(); ++k) {
    r.dbeta[k % C] += g_masked[k];
    r.dgamma[k % C] += g_masked[k] * xhat[k];
  }
  for (std::size_t k = 0; k < x.size(); ++k) {
    const std::size_t j = k % C;
    const double scale = (gamma ? (*gamma)[j] : 1.0) / std::sqrt(v[j] + eps);
    r.dx[k] = scale * (g_masked[k] - r.dbeta[j] / static_cast<double>(rows) -
                       xhat[k] * r.dgamma[j] / static_cast<double>(rows));
  }
  return r;
}

// The running statistics after one training step, as PyTorch updates them: each moves `momentum`
// of the way to the batch's mean and to its unbiased variance (var · rows / (rows − 1)).
struct RunningStats {
  std::vector<double> mean, var;
};
RunningStats updated_running_stats(const std::vector<float>& mean0, const std::vector<float>& var0,
                                   const BatchNormReference& batch, float momentum,
                                   std::int64_t rows) {
  RunningStats r{std::vector<double>(mean0.size()), std::vector<double>(var0.size())};
  for (std::size_t j = 0; j < r.mean.size(); ++j) {
    r.mean[j] = (1.0 - momentum) * mean0[j] + double{momentum} * batch.mean[j];
    r.var[j] = (1.0 - momentum) * var0[j] +
               double{momentum} * batch.var[j] * static_cast<double>(rows) / (rows - 1.0);
  }
  return r;
}

TEST_P(Conformance, BatchNormTrainingInferenceAndBackwardMatchADoubleReference) {
  MIXTRAIN_FACETS(batch_norm, BatchNormFacet);
  using N = sdk::BatchNormOp;
  const Shape xs{2, 5, 7, 6};  // [N, H, W, C]: rows = 70
  const std::int64_t rows = 70, c = 6;
  const float momentum = 0.1f;
  const auto xv = random_values(static_cast<std::size_t>(xs.numel()), 80, -1.f, 3.f);
  const auto dyv = random_values(static_cast<std::size_t>(xs.numel()), 81);
  const auto gv = random_values(static_cast<std::size_t>(c), 82, 0.5f, 1.5f);
  const auto bv = random_values(static_cast<std::size_t>(c), 83, -0.5f, 0.5f);
  const auto rm0 = random_values(static_cast<std::size_t>(c), 84, -0.1f, 0.1f);
  const auto rv0 = random_values(static_cast<std::size_t>(c), 85, 0.5f, 1.5f);
  const auto g_real = widen(gv), b_real = widen(bv);
  if (!tested_batch_norm->supports(N::batchnorm_forward_training, std::vector<DType>{DType::fp32}))
    GTEST_SKIP() << "backend '" << GetParam().name << "' has no batch norm";
  for (DType dt : kStorageFloats) {
    const std::vector<DType> d{dt};
    if (!tested_batch_norm->supports(N::batchnorm_forward_training, d) ||
        !tested_batch_norm->supports(N::batchnorm_forward_inference, d) ||
        !tested_batch_norm->supports(N::batchnorm_backward, d))
      continue;
    const double tol = output_tolerance(dt);
    for (bool relu : {false, true})
      for (bool affine : {false, true}) {
        const sdk::BatchNormShape s{rows, c, 1e-5f, relu};
        const std::string what = std::string(sdk::dtype_name(dt)) + (relu ? " relu" : "") +
                                 (affine ? " affine" : " not affine");
        auto x = upload(xv, xs, dt);
        auto y = zeros(xs, dt);
        auto gamma = upload(gv, Shape{c});
        auto beta = upload(bv, Shape{c});
        auto mean = zeros(Shape{c}), var = zeros(Shape{c});
        auto rm = upload(rm0, Shape{c}), rv = upload(rv0, Shape{c});
        auto ws_ref = workspace_on(*ref_, ref_batch_norm->batchnorm_workspace_bytes(s, dt));
        auto ws_tested =
            workspace_on(*tested_, tested_batch_norm->batchnorm_workspace_bytes(s, dt));
        if (!relu) {
          EXPECT_EQ(tested_batch_norm->batchnorm_workspace_bytes(s, dt), 0u) << what;
        }
        auto on = [&](int which, const Pair& p) {
          return which == 0 ? p.ref->view() : p.tested->view();
        };
        for (int which : {0, 1}) {
          auto* f = which == 0 ? ref_batch_norm : tested_batch_norm;
          f->batchnorm_forward_training(
              on(which, x), affine ? on(which, gamma) : TensorView{},
              affine ? on(which, beta) : TensorView{}, s, momentum, on(which, y), on(which, mean),
              on(which, var), on(which, rm), on(which, rv),
              relu ? (which == 0 ? ws_ref : ws_tested)->view() : TensorView{});
        }
        const auto x_real = widen(tested_values(x));
        const auto want = naive_batchnorm(rows, c, 1e-5, relu, x_real, affine ? &g_real : nullptr,
                                          affine ? &b_real : nullptr, nullptr, nullptr, {});
        EXPECT_LE(relative_to(tested_values(y), want.y), tol) << "batchnorm training y, " << what;
        EXPECT_LE(relative_to(tested_values(mean), want.mean), 1e-6) << "save_mean, " << what;
        EXPECT_LE(relative_to(tested_values(var), want.var), 1e-5) << "save_var, " << what;
        const RunningStats want_running = updated_running_stats(rm0, rv0, want, momentum, rows);
        EXPECT_LE(relative_to(tested_values(rm), want_running.mean), 1e-6)
            << "running_mean, " << what;
        EXPECT_LE(relative_to(tested_values(rv), want_running.var), 1e-6)
            << "running_var, " << what;
        expect_close(y, tol, "batchnorm training y vs the reference backend, " + what);
        expect_close(var, 1e-5, "save_var vs the reference backend, " + what);

        // Inference with the updated running statistics.
        auto yi = zeros(xs, dt);
        for (int which : {0, 1})
          (which == 0 ? ref_batch_norm : tested_batch_norm)
              ->batchnorm_forward_inference(on(which, x), affine ? on(which, gamma) : TensorView{},
                                            affine ? on(which, beta) : TensorView{}, on(which, rm),
                                            on(which, rv), s, on(which, yi));
        const auto rm_now = widen(tested_values(rm)), rv_now = widen(tested_values(rv));
        const auto want_inf =
            naive_batchnorm(rows, c, 1e-5, relu, x_real, affine ? &g_real : nullptr,
                            affine ? &b_real : nullptr, &rm_now, &rv_now, {});
        EXPECT_LE(relative_to(tested_values(yi), want_inf.y), tol)
            << "batchnorm inference, " << what;
        expect_close(yi, tol, "batchnorm inference vs the reference backend, " + what);

        // Backward from the saved statistics, with the workspace and (relu) from y alone.
        auto dy = upload(dyv, xs, dt);
        const auto saved_mean = widen(tested_values(mean)), saved_var = widen(tested_values(var));
        const auto want_b = naive_batchnorm(rows, c, 1e-5, relu, x_real, affine ? &g_real : nullptr,
                                            affine ? &b_real : nullptr, &saved_mean, &saved_var,
                                            widen(tested_values(dy)));
        for (bool from_ws : {true, false})
          for (bool accumulate : {false, true}) {
            if (!relu && !from_ws) continue;
            const auto dg0 = random_values(static_cast<std::size_t>(c), 86);
            const auto db0 = random_values(static_cast<std::size_t>(c), 87);
            auto dx = zeros(xs, dt);
            auto dg = upload(dg0, Shape{c}), db = upload(db0, Shape{c});
            for (int which : {0, 1}) {
              const TensorView ws =
                  relu && from_ws ? (which == 0 ? ws_ref : ws_tested)->view() : TensorView{};
              (which == 0 ? ref_batch_norm : tested_batch_norm)
                  ->batchnorm_backward(on(which, dy), on(which, x), on(which, y),
                                       affine ? on(which, gamma) : TensorView{}, on(which, mean),
                                       on(which, var), s, ws, on(which, dx),
                                       affine ? on(which, dg) : TensorView{},
                                       affine ? on(which, db) : TensorView{}, accumulate);
            }
            const std::string bwhat = what + (relu ? (from_ws ? ", workspace" : ", from y") : "") +
                                      (accumulate ? ", accumulate" : "");
            EXPECT_LE(relative_to(tested_values(dx), want_b.dx), std::max(tol, 1e-5))
                << "batchnorm_backward dx, " << bwhat;
            expect_close(dx, std::max(tol, 1e-5),
                         "batchnorm_backward dx vs the reference backend, " + bwhat);
            if (!affine) continue;
            std::vector<double> want_dg = want_b.dgamma, want_db = want_b.dbeta;
            for (std::size_t j = 0; j < want_dg.size(); ++j) {
              want_dg[j] += accumulate ? dg0[j] : 0.0;
              want_db[j] += accumulate ? db0[j] : 0.0;
            }
            EXPECT_LE(relative_to(tested_values(dg), want_dg), 1e-5) << "dgamma, " << bwhat;
            EXPECT_LE(relative_to(tested_values(db), want_db), 1e-5) << "dbeta, " << bwhat;
            expect_close(dg, 1e-5, "dgamma vs the reference backend, " + bwhat);
            expect_close(db, 1e-5, "dbeta vs the reference backend, " + bwhat);
          }
      }
  }
}

// Version 2's split ops (synchronized batch norm) on one rank's batch: the statistics are the
// training forward's, and reduce + elementwise with this batch's own statistics and sums are the
// fused backward (its dgamma / dbeta are the sums; dx differs only by the rounding of the sums'
// means to fp32).
TEST_P(Conformance, BatchNormSplitOpsEqualTheFusedOnes) {
  MIXTRAIN_FACETS(batch_norm, BatchNormFacet);
  using N = sdk::BatchNormOp;
  const Shape xs{2, 5, 7, 6};  // [N, H, W, C]: rows = 70
  const std::int64_t rows = 70, c = 6;
  const auto xv = random_values(static_cast<std::size_t>(xs.numel()), 90, -1.f, 3.f);
  const auto dyv = random_values(static_cast<std::size_t>(xs.numel()), 91);
  const auto gv = random_values(static_cast<std::size_t>(c), 92, 0.5f, 1.5f);
  const auto bv = random_values(static_cast<std::size_t>(c), 93, -0.5f, 0.5f);
  const auto g_real = widen(gv), b_real = widen(bv);
  std::size_t ran = 0;
  for (DType dt : kStorageFloats) {
    const std::vector<DType> d{dt};
    if (!tested_batch_norm->supports(N::batchnorm_statistics, d) ||
        !tested_batch_norm->supports(N::batchnorm_backward_reduce, d) ||
        !tested_batch_norm->supports(N::batchnorm_backward_elementwise, d) ||
        !tested_batch_norm->supports(N::batchnorm_forward_training, d) ||
        !tested_batch_norm->supports(N::batchnorm_backward, d))
      continue;
    ++ran;
    auto* bn = tested_batch_norm;
    // fp32 results agree to a few ulps; a bf16 / fp16 dx may round the other way where the
    // coefficients differ in their last fp32 bit.
    const double dx_tol = dt == DType::fp32 ? 1e-6 : 0.25 * output_tolerance(dt);
    for (bool relu : {false, true})
      for (bool affine : {false, true}) {
        const sdk::BatchNormShape s{rows, c, 1e-5f, relu};
        const std::string what = std::string(sdk::dtype_name(dt)) + (relu ? " relu" : "") +
                                 (affine ? " affine" : " not affine");
        auto x = upload(xv, xs, dt);
        auto y = zeros(xs, dt);
        auto dy = upload(dyv, xs, dt);
        auto gamma = upload(gv, Shape{c}), beta = upload(bv, Shape{c});
        auto save_mean = zeros(Shape{c}), save_var = zeros(Shape{c});
        const TensorView g = affine ? gamma.tested->view() : TensorView{};
        const TensorView b = affine ? beta.tested->view() : TensorView{};
        bn->batchnorm_forward_training(x.tested->view(), g, b, s, 0.1f, y.tested->view(),
                                       save_mean.tested->view(), save_var.tested->view(), {}, {},
                                       {});

        auto mean = zeros(Shape{c}), var = zeros(Shape{c});
        bn->batchnorm_statistics(x.tested->view(), s, mean.tested->view(), var.tested->view());
        EXPECT_EQ(tested_values(mean), tested_values(save_mean)) << "statistics mean, " << what;
        EXPECT_EQ(tested_values(var), tested_values(save_var)) << "statistics var, " << what;

        // The fused backward, its ReLU mask from y as the split ops take it.
        auto dx_fused = zeros(xs, dt);
        auto dg = zeros(Shape{c}), db = zeros(Shape{c});
        bn->batchnorm_backward(dy.tested->view(), x.tested->view(), y.tested->view(), g,
                               save_mean.tested->view(), save_var.tested->view(), s, {},
                               dx_fused.tested->view(), affine ? dg.tested->view() : TensorView{},
                               affine ? db.tested->view() : TensorView{}, false);

        auto sum_dy = zeros(Shape{c}), sum_dy_xhat = zeros(Shape{c});
        bn->batchnorm_backward_reduce(dy.tested->view(), x.tested->view(),
                                      relu ? y.tested->view() : TensorView{}, mean.tested->view(),
                                      var.tested->view(), s, sum_dy.tested->view(),
                                      sum_dy_xhat.tested->view());
        const auto x_real = widen(tested_values(x));
        const auto m_real = widen(tested_values(mean)), v_real = widen(tested_values(var));
        const auto want =
            naive_batchnorm(rows, c, 1e-5, relu, x_real, affine ? &g_real : nullptr,
                            affine ? &b_real : nullptr, &m_real, &v_real, widen(tested_values(dy)));
        EXPECT_LE(relative_to(tested_values(sum_dy), want.dbeta), 1e-5) << "sum_dy, " << what;
        EXPECT_LE(relative_to(tested_values(sum_dy_xhat), want.dgamma), 1e-5)
            << "sum_dy_xhat, " << what;
        if (affine) {
          EXPECT_LE(relative_difference(tested_values(sum_dy), tested_values(db)), 1e-6)
              << "sum_dy vs the fused dbeta, " << what;
          EXPECT_LE(relative_difference(tested_values(sum_dy_xhat), tested_values(dg)), 1e-6)
              << "sum_dy_xhat vs the fused dgamma, " << what;
        }

        // One rank: the global means are this batch's sums over its rows.
        std::vector<float> mdy = tested_values(sum_dy), mdyx = tested_values(sum_dy_xhat);
        for (std::size_t j = 0; j < mdy.size(); ++j) {
          mdy[j] = static_cast<float>(static_cast<double>(mdy[j]) / rows);
          mdyx[j] = static_cast<float>(static_cast<double>(mdyx[j]) / rows);
        }
        auto mean_dy = upload(mdy, Shape{c}), mean_dy_xhat = upload(mdyx, Shape{c});
        auto dx = zeros(xs, dt);
        bn->batchnorm_backward_elementwise(
            dy.tested->view(), x.tested->view(), relu ? y.tested->view() : TensorView{}, g,
            mean.tested->view(), var.tested->view(), mean_dy.tested->view(),
            mean_dy_xhat.tested->view(), s, dx.tested->view());
        EXPECT_LE(relative_difference(tested_values(dx), tested_values(dx_fused)), dx_tol)
            << "elementwise dx vs the fused backward's, " << what;
        EXPECT_LE(relative_to(tested_values(dx), want.dx), std::max(output_tolerance(dt), 1e-5))
            << "elementwise dx vs the double reference, " << what;
      }
  }
  if (ran == 0) GTEST_SKIP() << "backend '" << GetParam().name << "' has no batch norm v2 ops";
}

// A channel whose backward sums cancel: dy is a random gradient with its mean and its projection on
// x − mean taken out (in double, then rounded to the storage dtype), so Σ dy and Σ dy·x̂ are a
// millionth of Σ |dy| and Σ |dy·x̂|. Summed in fp32 they would be off by about the size of the
// answer (each partial sum's rounding is ~1e-7 of Σ |dy|); the backend's reductions must return
// them as a double sum of the stored values does, per channel, through the fused backward and the
// synchronized batch norm's reduce. The other channels are plain random gradients.
TEST_P(Conformance, BatchNormSumsOfACancellingChannelMatchADoubleReference) {
  MIXTRAIN_FACETS(batch_norm, BatchNormFacet);
  using N = sdk::BatchNormOp;
  const Shape xs{4, 28, 28, 16};  // [N, H, W, C]: rows = 3136, the 16 channels of a ResNet stage
  const std::int64_t rows = 3136, c = 16;
  const auto C = static_cast<std::size_t>(c);
  const auto n = static_cast<std::size_t>(xs.numel());
  const auto xv = random_values(n, 100, -1.f, 3.f);
  const auto uv = random_values(n, 101);
  const auto gv = random_values(C, 102, 0.5f, 1.5f);
  const auto bv = random_values(C, 103, -0.5f, 0.5f);
  const auto g_real = widen(gv);
  std::size_t ran = 0;
  for (DType dt : kStorageFloats) {
    const std::vector<DType> d{dt};
    if (!tested_batch_norm->supports(N::batchnorm_forward_training, d) ||
        !tested_batch_norm->supports(N::batchnorm_backward, d))
      continue;
    ++ran;
    auto* bn = tested_batch_norm;
    const sdk::BatchNormShape s{rows, c, 1e-5f, false};
    const std::string what(sdk::dtype_name(dt));
    auto x = upload(xv, xs, dt), y = zeros(xs, dt);
    auto gamma = upload(gv, Shape{c}), beta = upload(bv, Shape{c});
    auto mean = zeros(Shape{c}), var = zeros(Shape{c});
    bn->batchnorm_forward_training(x.tested->view(), gamma.tested->view(), beta.tested->view(), s,
                                   0.1f, y.tested->view(), mean.tested->view(), var.tested->view(),
                                   {}, {}, {});
    const auto x_real = widen(tested_values(x));
    const auto m_real = widen(tested_values(mean)), v_real = widen(tested_values(var));

    // Channel 0's dy = u − α − β·(x − mean), least squares in double.
    std::vector<float> dyv = uv;
    double su = 0, sd = 0, sdd = 0, sud = 0;
    for (std::int64_t i = 0; i < rows; ++i) {
      const auto k = static_cast<std::size_t>(i) * C;
      const double dx0 = x_real[k] - m_real[0];
      su += uv[k];
      sd += dx0;
      sdd += dx0 * dx0;
      sud += uv[k] * dx0;
    }
    const double r = static_cast<double>(rows);
    const double beta_fit = (sud - su * sd / r) / (sdd - sd * sd / r);
    const double alpha_fit = (su - beta_fit * sd) / r;
    for (std::int64_t i = 0; i < rows; ++i) {
      const auto k = static_cast<std::size_t>(i) * C;
      dyv[k] = static_cast<float>(uv[k] - alpha_fit - beta_fit * (x_real[k] - m_real[0]));
    }
    auto dy = upload(dyv, xs, dt);
    const auto dy_real = widen(tested_values(dy));
    const auto want =
        naive_batchnorm(rows, c, 1e-5, false, x_real, &g_real, nullptr, &m_real, &v_real, dy_real);
    // How hard channel 0 cancels: Σ |dy| against |Σ dy| (> 1e4 even where bf16 rounds dy).
    double abs_sum = 0.0;
    for (std::int64_t i = 0; i < rows; ++i)
      abs_sum += std::abs(dy_real[static_cast<std::size_t>(i) * C]);
    ASSERT_GT(abs_sum, 1e4 * std::abs(want.dbeta[0])) << what;

    auto dx = zeros(xs, dt), dg = zeros(Shape{c}), db = zeros(Shape{c});
    bn->batchnorm_backward(dy.tested->view(), x.tested->view(), y.tested->view(),
                           gamma.tested->view(), mean.tested->view(), var.tested->view(), s, {},
                           dx.tested->view(), dg.tested->view(), db.tested->view(), false);
    std::vector<std::pair<std::string, std::vector<float>>> dbeta{{"dbeta", tested_values(db)}},
        dgamma{{"dgamma", tested_values(dg)}};
    if (tested_batch_norm->supports(N::batchnorm_backward_reduce, d)) {
      auto sum_dy = zeros(Shape{c}), sum_dy_xhat = zeros(Shape{c});
      bn->batchnorm_backward_reduce(dy.tested->view(), x.tested->view(), TensorView{},
                                    mean.tested->view(), var.tested->view(), s,
                                    sum_dy.tested->view(), sum_dy_xhat.tested->view());
      dbeta.emplace_back("sum_dy", tested_values(sum_dy));
      dgamma.emplace_back("sum_dy_xhat", tested_values(sum_dy_xhat));
    }
    // dgamma = Σ dy·x̂ is γ-free (x̂ from the saved statistics), as naive_batchnorm's.
    for (std::size_t j = 0; j < C; ++j) {
      for (const auto& [name, got] : dbeta)
        EXPECT_NEAR(got[j], want.dbeta[j], 1e-5 * std::abs(want.dbeta[j]))
            << name << " of channel " << j << ", " << what;
      for (const auto& [name, got] : dgamma)
        EXPECT_NEAR(got[j], want.dgamma[j], 1e-5 * std::abs(want.dgamma[j]))
            << name << " of channel " << j << ", " << what;
    }
  }
  if (ran == 0) GTEST_SKIP() << "backend '" << GetParam().name << "' has no batch norm";
}

TEST_P(Conformance, BatchNormSplitOpsRejectBadArguments) {
  MIXTRAIN_FACETS(batch_norm, BatchNormFacet);
  if (!tested_batch_norm->supports(sdk::BatchNormOp::batchnorm_statistics,
                                   std::vector<DType>{DType::fp32}))
    GTEST_SKIP() << "backend '" << GetParam().name << "' has no batch norm v2 ops";
  const std::int64_t rows = 8, c = 3;
  const sdk::BatchNormShape s{rows, c, 1e-5f, false}, relu{rows, c, 1e-5f, true};
  auto x = upload(random_values(24, 95), Shape{rows, c});
  auto dy = upload(random_values(24, 96), Shape{rows, c});
  auto dx = zeros(Shape{rows, c});
  auto v = upload(std::vector<float>(3, 1.0f), Shape{c});
  auto v2 = zeros(Shape{c}), v3 = zeros(Shape{c}), v4 = zeros(Shape{c});
  auto short_v = zeros(Shape{c - 1});
  auto* bn = tested_batch_norm;
  // A statistics vector of the wrong length, x not [rows, C], y missing under the fused ReLU, a
  // bf16 dx for fp32 x.
  EXPECT_THROW(
      bn->batchnorm_statistics(x.tested->view(), s, v2.tested->view(), short_v.tested->view()),
      sdk::BackendError);
  EXPECT_THROW(bn->batchnorm_statistics(x.tested->view(), {rows, c + 1, 1e-5f, false},
                                        v2.tested->view(), v3.tested->view()),
               sdk::BackendError);
  EXPECT_THROW(
      bn->batchnorm_backward_reduce(dy.tested->view(), x.tested->view(), {}, v2.tested->view(),
                                    v.tested->view(), relu, v3.tested->view(), v4.tested->view()),
      sdk::BackendError);
  auto dx_bf16 = zeros(Shape{rows, c}, DType::bf16);
  EXPECT_THROW(bn->batchnorm_backward_elementwise(
                   dy.tested->view(), x.tested->view(), {}, {}, v2.tested->view(), v.tested->view(),
                   v3.tested->view(), v4.tested->view(), s, dx_bf16.tested->view()),
               sdk::BackendError);
  // The same calls with good arguments run.
  EXPECT_NO_THROW(bn->batchnorm_backward_elementwise(
      dy.tested->view(), x.tested->view(), {}, {}, v2.tested->view(), v.tested->view(),
      v3.tested->view(), v4.tested->view(), s, dx.tested->view()));
}

// 1.2's batch norm + add + ReLU against batch norm in double plus the residual, rounded once:
// training (its statistics and running statistics as the training forward's) and evaluation,
// with and without the ReLU, the residual a tensor of its own or y itself.
TEST_P(Conformance, BatchNormAddForwardIsBatchNormPlusTheResidualRoundedOnce) {
  MIXTRAIN_FACETS(batch_norm, BatchNormFacet);
  using N = sdk::BatchNormOp;
  if (tested_batch_norm->version() < sdk::FacetVersion{1, 2})
    GTEST_SKIP() << "backend '" << GetParam().name << "' has batch norm "
                 << sdk::to_string(tested_batch_norm->version()) << " (the fused add is 1.2)";
  const Shape xs{2, 5, 7, 6};  // [N, H, W, C]: rows = 70
  const std::int64_t rows = 70, c = 6;
  const float momentum = 0.1f;
  const auto xv = random_values(static_cast<std::size_t>(xs.numel()), 180, -1.f, 3.f);
  const auto rv_values = random_values(static_cast<std::size_t>(xs.numel()), 181, -2.f, 2.f);
  const auto gv = random_values(static_cast<std::size_t>(c), 182, 0.5f, 1.5f);
  const auto bv = random_values(static_cast<std::size_t>(c), 183, -0.5f, 0.5f);
  const auto rm0 = random_values(static_cast<std::size_t>(c), 184, -0.1f, 0.1f);
  const auto rv0 = random_values(static_cast<std::size_t>(c), 185, 0.5f, 1.5f);
  const auto g_real = widen(gv), b_real = widen(bv);
  for (DType dt : kStorageFloats) {
    if (!tested_batch_norm->supports(N::batchnorm_add_forward, std::vector<DType>{dt})) continue;
    const double tol = output_tolerance(dt);
    for (bool training : {true, false})
      for (bool relu : {false, true})
        for (bool into_residual : {false, true}) {
          const std::string what = std::string(sdk::dtype_name(dt)) +
                                   (training ? " training" : " evaluation") +
                                   (relu ? " relu" : "") + (into_residual ? ", y = residual" : "");
          auto x = upload(xv, xs, dt);
          auto r = upload(rv_values, xs, dt);
          auto y = zeros(xs, dt);
          auto gamma = upload(gv, Shape{c}), beta = upload(bv, Shape{c});
          auto mean = zeros(Shape{c}), var = zeros(Shape{c});
          auto rm = upload(rm0, Shape{c}), rv = upload(rv0, Shape{c});
          const auto x_real = widen(tested_values(x)), r_real = widen(tested_values(r));
          for (int which : {0, 1}) {
            auto on = [&](const Pair& p) { return which == 0 ? p.ref->view() : p.tested->view(); };
            sdk::BatchNormAddArgs a;
            a.x = on(x);
            a.residual = on(r);
            a.gamma = on(gamma);
            a.beta = on(beta);
            a.shape = {rows, c, 1e-5f, relu};
            a.training = training;
            a.momentum = momentum;
            a.y = into_residual ? on(r) : on(y);
            a.save_mean = on(mean);
            a.save_var = on(var);
            a.running_mean = on(rm);
            a.running_var = on(rv);
            (which == 0 ? ref_batch_norm : tested_batch_norm)->batchnorm_add_forward(a);
          }
          const Pair& out = into_residual ? r : y;
          std::vector<double> use_mean = widen(rm0), use_var = widen(rv0);
          const BatchNormReference bn =
              naive_batchnorm(rows, c, 1e-5, false, x_real, &g_real, &b_real,
                              training ? nullptr : &use_mean, training ? nullptr : &use_var, {});
          std::vector<double> want(bn.y.size());
          for (std::size_t i = 0; i < want.size(); ++i) {
            const double v = bn.y[i] + r_real[i];
            want[i] = relu && v < 0.0 ? 0.0 : v;
          }
          EXPECT_LE(relative_to(tested_values(out), want), tol) << "y, " << what;
          expect_close(out, tol, "y vs the reference backend, " + what);
          if (!training) {
            EXPECT_EQ(tested_values(rm), rm0) << "evaluation moved running_mean, " << what;
            continue;
          }
          EXPECT_LE(relative_to(tested_values(mean), bn.mean), 1e-6) << "save_mean, " << what;
          EXPECT_LE(relative_to(tested_values(var), bn.var), 1e-5) << "save_var, " << what;
          const RunningStats want_running = updated_running_stats(rm0, rv0, bn, momentum, rows);
          EXPECT_LE(relative_to(tested_values(rm), want_running.mean), 1e-6)
              << "running_mean, " << what;
          EXPECT_LE(relative_to(tested_values(rv), want_running.var), 1e-6)
              << "running_var, " << what;
        }
  }
}

TEST_P(Conformance, BatchNormAddForwardRejectsBadArguments) {
  MIXTRAIN_FACETS(batch_norm, BatchNormFacet);
  if (tested_batch_norm->version() < sdk::FacetVersion{1, 2})
    GTEST_SKIP() << "backend '" << GetParam().name << "' has no batch norm + add";
  const std::int64_t rows = 8, c = 3;
  auto x = upload(random_values(24, 195), Shape{rows, c});
  auto r = upload(random_values(24, 196), Shape{rows, c});
  auto r_bf16 = zeros(Shape{rows, c}, DType::bf16);
  auto y = zeros(Shape{rows, c});
  auto m = zeros(Shape{c}), v = zeros(Shape{c});
  sdk::BatchNormAddArgs a;
  a.x = x.tested->view();
  a.residual = r.tested->view();
  a.shape = {rows, c, 1e-5f, true};
  a.y = y.tested->view();
  a.save_mean = m.tested->view();
  a.save_var = v.tested->view();
  auto rejects = [&](sdk::BatchNormAddArgs bad, const std::string& why) {
    try {
      tested_batch_norm->batchnorm_add_forward(bad);
      ADD_FAILURE() << "accepted " << why;
    } catch (const sdk::BackendError& e) {
      EXPECT_NE(std::string(e.what()).find("batchnorm_add_forward"), std::string::npos) << e.what();
    }
  };
  sdk::BatchNormAddArgs bad = a;
  bad.y = a.x;
  rejects(bad, "y = x");
  bad = a;
  bad.residual = r_bf16.tested->view();
  rejects(bad, "a bf16 residual for fp32 x");
  bad = a;
  bad.save_mean = {};
  rejects(bad, "training without save_mean");
  bad = a;
  bad.training = false;
  rejects(bad, "evaluation without running statistics");
  bad = a;
  bad.momentum = 1.5f;
  rejects(bad, "momentum 1.5");
  EXPECT_NO_THROW(tested_batch_norm->batchnorm_add_forward(a));
}

// Residual 1.1's backward: every input's gradient is dy masked where y is not positive (+0 there,
// NaN in y masks, NaN in dy passes), rounded once into its own dtype, from one call; a gradient
// that is dy itself is masked in place, an empty one is skipped.
TEST_P(Conformance, AddBackwardWritesEveryInputsMaskedGradientInOneCall) {
  MIXTRAIN_FACETS(residual, ResidualFacet);
  if (tested_residual->version() < sdk::FacetVersion{1, 1})
    GTEST_SKIP() << "backend '" << GetParam().name << "' has residual "
                 << sdk::to_string(tested_residual->version()) << " (add_backward is 1.1)";
  const std::int64_t n = 4099;
  auto dyv = random_values(static_cast<std::size_t>(n), 190, -3.f, 3.f);
  auto yv = random_values(static_cast<std::size_t>(n), 191, -1.f, 1.f);
  yv[5] = std::numeric_limits<float>::quiet_NaN();
  yv[6] = 0.0f;
  yv[9] = 0.5f;
  dyv[9] = std::numeric_limits<float>::quiet_NaN();
  for (DType gt : kStorageFloats)
    for (DType xt : kStorageFloats) {
      const std::vector<DType> sig{gt, xt};
      if (!tested_residual->supports(sdk::ResidualOp::add_backward, sig)) continue;
      for (bool relu : {false, true}) {
        const std::string what = std::string(sdk::dtype_name(gt)) + " -> " +
                                 std::string(sdk::dtype_name(xt)) + (relu ? " relu" : "");
        auto dy = upload(dyv, Shape{n}, gt);
        auto y = upload(yv, Shape{n}, gt);
        auto d1 = zeros(Shape{n}, xt), d2 = zeros(Shape{n}, DType::fp32);
        const auto dy_real = tested_values(dy), y_real = tested_values(y);
        for (int which : {0, 1}) {
          auto on = [&](const Pair& p) { return which == 0 ? p.ref->view() : p.tested->view(); };
          const TensorView dxs[] = {on(d1), TensorView{}, on(d2)};
          (which == 0 ? ref_residual : tested_residual)
              ->add_backward(on(dy), relu ? on(y) : TensorView{}, relu, dxs);
        }
        const auto got1 = tested_values(d1), got2 = tested_values(d2);
        for (std::size_t i = 0; i < got1.size(); ++i) {
          const bool pass = !relu || y_real[i] > 0.0f;
          const float g = pass ? dy_real[i] : 0.0f;
          if (std::isnan(g)) {
            EXPECT_TRUE(std::isnan(got1[i]) && std::isnan(got2[i])) << what << " element " << i;
            continue;
          }
          ASSERT_EQ(got1[i], stored(g, xt)) << what << " element " << i;
          ASSERT_EQ(got2[i], g) << what << " (fp32) element " << i;
          if (!pass) {
            ASSERT_FALSE(std::signbit(got1[i])) << what << ": a masked element is +0, " << i;
          }
        }
        if (xt != gt) continue;
        // In place: dy's own memory is one of the gradients.
        for (int which : {0, 1}) {
          auto on = [&](const Pair& p) { return which == 0 ? p.ref->view() : p.tested->view(); };
          const TensorView dxs[] = {on(dy), on(d2)};
          (which == 0 ? ref_residual : tested_residual)
              ->add_backward(on(dy), relu ? on(y) : TensorView{}, relu, dxs);
        }
        const auto in_place = tested_values(dy);
        for (std::size_t i = 0; i < in_place.size(); ++i)
          if (!std::isnan(got1[i])) {
            ASSERT_EQ(in_place[i], got1[i]) << what << " in place, " << i;
          }
      }
    }
  // Bad arguments: no gradients, a gradient of another size, one overlapping y.
  auto dy = upload(dyv, Shape{n});
  auto y = upload(yv, Shape{n});
  auto small = zeros(Shape{n - 1});
  EXPECT_THROW(tested_residual->add_backward(dy.tested->view(), y.tested->view(), true, {}),
               sdk::BackendError);
  const TensorView wrong[] = {small.tested->view()};
  EXPECT_THROW(tested_residual->add_backward(dy.tested->view(), y.tested->view(), true, wrong),
               sdk::BackendError);
  const TensorView onto_y[] = {y.tested->view()};
  EXPECT_THROW(tested_residual->add_backward(dy.tested->view(), y.tested->view(), true, onto_y),
               sdk::BackendError);
}

}  // namespace
}  // namespace mixtrain::conformance
