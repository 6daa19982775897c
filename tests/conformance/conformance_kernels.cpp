// The element-wise, reduction, normalisation, loss and optimizer ops: capabilities, casts bit for
// bit, add, the layer kernels and layer norm, softmax cross-entropy, reductions and non-finite
// checks, the fused and gated optimizer updates.
#include <cmath>
#include <cstring>

#include "conformance_fixture.h"

namespace mixtrain::conformance {
namespace internal {
void link_kernels() {}  // see link_all_test_files()
}  // namespace internal

namespace {

using namespace internal;

TEST_P(Conformance, CapabilitiesDeclareFp32) {
  auto caps = tested_->capabilities();
  EXPECT_FALSE(caps.kind.empty());
  EXPECT_FALSE(caps.device_name.empty());
  EXPECT_TRUE(caps.supports(DType::fp32));
}

TEST_P(Conformance, CastsAgreeBitForBit) {
  auto values = random_values(4099, 1, -600.f, 600.f);
  values[0] = 0.0f;
  values[1] = -0.0f;
  values[2] = 1e-9f;    // below every 16/8-bit subnormal
  values[3] = 70000.f;  // overflows fp16
  for (DType to : {DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2}) {
    if (!tested_->capabilities().supports(to)) continue;
    for (float scale : {1.0f, 0.25f}) {
      auto p = upload(values, Shape{4099}, to, scale);
      EXPECT_EQ(tested_values(p), ref_values(p)) << sdk::dtype_name(to) << " scale " << scale;
    }
  }
}

TEST_P(Conformance, AddIsTheFp32SumRoundedOnceWithAnOptionalRelu) {
  MIXTRAIN_FACETS(residual, ResidualFacet);
  const std::int64_t n = 4099;
  auto av = random_values(static_cast<std::size_t>(n), 31, -3.f, 3.f);
  av[7] = std::numeric_limits<float>::quiet_NaN();
  const auto bv = random_values(static_cast<std::size_t>(n), 32, -3.f, 3.f);
  for (DType dt : {DType::fp32, DType::bf16, DType::fp16}) {
    if (!tested_residual->supports(sdk::ResidualOp::add, std::vector<DType>{dt, dt}) ||
        !tested_residual->supports(sdk::ResidualOp::add, std::vector<DType>{DType::fp32, dt}))
      continue;
    for (bool relu : {false, true}) {
      const std::string what = std::string(sdk::dtype_name(dt)) + (relu ? " relu" : "");
      auto a = upload(av, Shape{n}, dt);
      auto b = upload(bv, Shape{n});
      auto y = zeros(Shape{n}, dt);
      const sdk::TensorView ref_in[] = {a.ref->view(), b.ref->view()};
      const sdk::TensorView tested_in[] = {a.tested->view(), b.tested->view()};
      ref_residual->add(ref_in, relu, y.ref->view());
      tested_residual->add(tested_in, relu, y.tested->view());
      const auto want = ref_values(y), got = tested_values(y);
      for (std::size_t i = 0; i < want.size(); ++i) {
        if (std::isnan(want[i])) {
          EXPECT_TRUE(std::isnan(got[i])) << what << " element " << i;
        } else {
          EXPECT_EQ(got[i], want[i]) << what << " element " << i;
        }
      }
      EXPECT_TRUE(std::isnan(got[7])) << what << ": the NaN must survive the join";
      // In place into the first input.
      ref_residual->add(ref_in, relu, a.ref->view());
      tested_residual->add(tested_in, relu, a.tested->view());
      const auto in_place = tested_values(a);
      for (std::size_t i = 0; i < want.size(); ++i) {
        if (!std::isnan(want[i])) {
          EXPECT_EQ(in_place[i], want[i]) << what << " in place";
        }
      }
    }
  }
}

// ReLU's special values by the activation contract (sdk/backend_activation.h), at a size one
// thread runs and one the threaded path runs (the CPU backend splits from 32,768 elements): y keeps
// a NaN x, and dx is dy where x > 0, else +0, whatever dy holds (inf, NaN, negative).
TEST_P(Conformance, ReluKeepsNaNAndMasksGradientsAtEverySize) {
  MIXTRAIN_FACETS(activation, ActivationFacet);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // x, dy, and the expected y and dx; the rest of the tensor is (1, 1) -> (1, 1).
  struct Special {
    float x, dy, y, dx;
  };
  const std::vector<Special> specials = {{nan, 1.0f, nan, 0.0f},   {-1.0f, inf, 0.0f, 0.0f},
                                         {-1.0f, nan, 0.0f, 0.0f}, {-2.0f, -3.0f, 0.0f, 0.0f},
                                         {0.0f, 5.0f, 0.0f, 0.0f}, {inf, 2.0f, inf, 2.0f},
                                         {-inf, 2.0f, 0.0f, 0.0f}, {3.0f, -4.0f, 3.0f, -4.0f}};
  for (const std::int64_t n : {std::int64_t{1000}, std::int64_t{40000}})
    for (const DType dt : {DType::fp32, DType::bf16}) {
      if (!tested_->capabilities().supports(dt)) continue;
      std::vector<float> xs(static_cast<std::size_t>(n), 1.0f), dys(xs.size(), 1.0f);
      // Spread over the tensor: the start, the middle and the end of each thread's share.
      std::vector<std::size_t> at;
      for (std::size_t i = 0; i < specials.size(); ++i)
        at.push_back(i * (xs.size() - 1) / (specials.size() - 1));
      for (std::size_t i = 0; i < specials.size(); ++i) {
        xs[at[i]] = specials[i].x;
        dys[at[i]] = specials[i].dy;
      }
      const Shape shape{n};
      auto x = make_on(*tested_, xs, shape, dt, 1.0f, /*saturate=*/false);
      auto dy = make_on(*tested_, dys, shape, dt, 1.0f, /*saturate=*/false);
      DeviceTensor y(*tested_, dt, shape), dx(*tested_, dt, shape);
      tested_activation->activation_forward(sdk::Activation::relu, x->view(), y.view());
      tested_activation->activation_backward(sdk::Activation::relu, x->view(), dy->view(),
                                             dx.view());
      const auto ys = download(*tested_, y.view()), dxs = download(*tested_, dx.view());
      const std::string what = std::string(sdk::dtype_name(dt)) + " n=" + std::to_string(n);
      for (std::size_t i = 0; i < specials.size(); ++i) {
        const auto& s = specials[i];
        const float yi = ys[at[i]], dxi = dxs[at[i]];
        if (std::isnan(s.y))
          EXPECT_TRUE(std::isnan(yi)) << what << ": relu(NaN) = " << yi;
        else
          EXPECT_EQ(yi, s.y) << what << ": relu(" << s.x << ")";
        EXPECT_EQ(dxi, s.dx) << what << ": x " << s.x << ", dy " << s.dy;
        EXPECT_FALSE(std::signbit(dxi) && dxi == 0.0f) << what << ": -0 for x " << s.x;
      }
      for (std::size_t i = 0; i < xs.size(); ++i)
        if (std::find(at.begin(), at.end(), i) == at.end()) {
          ASSERT_EQ(ys[i], 1.0f) << what << " element " << i;
          ASSERT_EQ(dxs[i], 1.0f) << what << " element " << i;
        }
    }
}

TEST_P(Conformance, LayerKernels) {
  MIXTRAIN_FACETS(activation, ActivationFacet);
  MIXTRAIN_FACETS(layer_norm, LayerNormFacet);
  const std::int64_t rows = 33, cols = 67;
  auto x = upload(random_values(rows * cols, 6, -3.f, 3.f), Shape{rows, cols});
  auto dy = upload(random_values(rows * cols, 7), Shape{rows, cols});
  for (auto act : {sdk::Activation::relu, sdk::Activation::gelu}) {
    auto y = zeros(Shape{rows, cols});
    auto dx = zeros(Shape{rows, cols});
    ref_activation->activation_forward(act, x.ref->view(), y.ref->view());
    tested_activation->activation_forward(act, x.tested->view(), y.tested->view());
    expect_close(y, 1e-6, "activation forward");
    ref_activation->activation_backward(act, x.ref->view(), dy.ref->view(), dx.ref->view());
    tested_activation->activation_backward(act, x.tested->view(), dy.tested->view(),
                                           dx.tested->view());
    expect_close(dx, 1e-6, "activation backward");
  }
  auto db = zeros(Shape{cols});
  ref_activation->bias_grad(dy.ref->view(), db.ref->view(), false);
  tested_activation->bias_grad(dy.tested->view(), db.tested->view(), false);
  expect_close(db, 1e-6, "bias_grad");

  auto gamma = upload(random_values(cols, 10, 0.5f, 1.5f), Shape{cols});
  auto beta = upload(random_values(cols, 11), Shape{cols});
  auto out = zeros(Shape{rows, cols});
  auto mean = zeros(Shape{rows}), rstd = zeros(Shape{rows});
  ref_layer_norm->layernorm_forward(x.ref->view(), gamma.ref->view(), beta.ref->view(), 1e-5f,
                                    out.ref->view(), mean.ref->view(), rstd.ref->view());
  tested_layer_norm->layernorm_forward(x.tested->view(), gamma.tested->view(), beta.tested->view(),
                                       1e-5f, out.tested->view(), mean.tested->view(),
                                       rstd.tested->view());
  expect_close(out, 1e-6, "layernorm forward");
  expect_close(rstd, 1e-6, "layernorm rstd");
  auto dx = zeros(Shape{rows, cols});
  auto dg = zeros(Shape{cols}), dbeta = zeros(Shape{cols});
  ref_layer_norm->layernorm_backward(dy.ref->view(), x.ref->view(), gamma.ref->view(),
                                     mean.ref->view(), rstd.ref->view(), dx.ref->view(),
                                     dg.ref->view(), dbeta.ref->view(), false);
  tested_layer_norm->layernorm_backward(dy.tested->view(), x.tested->view(), gamma.tested->view(),
                                        mean.tested->view(), rstd.tested->view(), dx.tested->view(),
                                        dg.tested->view(), dbeta.tested->view(), false);
  expect_close(dx, 1e-5, "layernorm dx");
  expect_close(dg, 1e-5, "layernorm dgamma");
  expect_close(dbeta, 1e-6, "layernorm dbeta");
}

// layer norm 1.1: the input gradient added into an fp32 sum is the reference's gradient written
// apart and added by axpy (the host's sum without it), for x and dy of each storage dtype.
TEST_P(Conformance, LayerNormBackwardAccumulateAddsTheGradientIntoAnFp32Sum) {
  MIXTRAIN_FACETS(activation, ActivationFacet);
  MIXTRAIN_FACETS(layer_norm, LayerNormFacet);
  if (tested_layer_norm->version() < sdk::FacetVersion{1, 1})
    GTEST_SKIP() << "backend '" << GetParam().name << "' has layer_norm facet "
                 << sdk::to_string(tested_layer_norm->version());
  const std::int64_t rows = 29, cols = 96;
  for (DType dt : {DType::fp32, DType::bf16}) {
    if (!tested_->capabilities().supports(dt) ||
        !tested_layer_norm->supports(sdk::LayerNormOp::layernorm_backward_accumulate,
                                     std::vector<DType>{dt}))
      continue;
    const std::string what = std::string(sdk::dtype_name(dt));
    auto x = upload(random_values(rows * cols, 60, -3.f, 3.f), Shape{rows, cols}, dt);
    auto dy = upload(random_values(rows * cols, 61), Shape{rows, cols}, dt);
    auto gamma = upload(random_values(cols, 62, 0.5f, 1.5f), Shape{cols});
    auto beta = upload(random_values(cols, 63), Shape{cols});
    auto y = zeros(Shape{rows, cols}, dt);
    auto mean = zeros(Shape{rows}), rstd = zeros(Shape{rows});
    for (int which : {0, 1}) {
      auto side = [&](const Pair& p) { return which == 0 ? p.ref->view() : p.tested->view(); };
      (which == 0 ? ref_layer_norm : tested_layer_norm)
          ->layernorm_forward(side(x), side(gamma), side(beta), 1e-5f, side(y), side(mean),
                              side(rstd));
    }
    for (bool accumulate : {false, true}) {
      auto sum = upload(random_values(rows * cols, 64), Shape{rows, cols});  // the other reader's
      auto scratch = zeros(Shape{rows, cols});
      auto dg = upload(random_values(cols, 65), Shape{cols});
      auto db = upload(random_values(cols, 66), Shape{cols});
      tested_layer_norm->layernorm_backward_accumulate(
          dy.tested->view(), x.tested->view(), gamma.tested->view(), mean.tested->view(),
          rstd.tested->view(), sum.tested->view(), dg.tested->view(), db.tested->view(),
          accumulate);
      ref_layer_norm->layernorm_backward(dy.ref->view(), x.ref->view(), gamma.ref->view(),
                                         mean.ref->view(), rstd.ref->view(), scratch.ref->view(),
                                         dg.ref->view(), db.ref->view(), accumulate);
      ref_activation->axpy(1.0f, scratch.ref->view(), sum.ref->view());
      const std::string where = what + (accumulate ? ", parameters accumulated" : "");
      expect_close(sum, 1e-5, "the sum, " + where);
      expect_close(dg, 1e-5, "dgamma, " + where);
      expect_close(db, 1e-6, "dbeta, " + where);
    }
    // dx must be the fp32 sum, apart from dy and x.
    auto dx16 = zeros(Shape{rows, cols}, DType::bf16);
    EXPECT_THROW(tested_layer_norm->layernorm_backward_accumulate(
                     dy.tested->view(), x.tested->view(), gamma.tested->view(), mean.tested->view(),
                     rstd.tested->view(), dx16.tested->view(), {}, {}, false),
                 sdk::BackendError)
        << "a bf16 dx, " << what;
    if (dt == DType::fp32) {
      EXPECT_THROW(tested_layer_norm->layernorm_backward_accumulate(
                       dy.tested->view(), x.tested->view(), gamma.tested->view(),
                       mean.tested->view(), rstd.tested->view(), dy.tested->view(), {}, {}, false),
                   sdk::BackendError)
          << "dx on dy";
    }
  }
}

// layer norm 1.2: the residual add and the layer norm of its sum in one pass write what the
// reference's add and layer norm write one after the other (the sum rounded once, then normalised
// as stored), for a residual stream of each storage dtype, a layer norm output in fp32 or that
// dtype, and the sum written over its first input.
TEST_P(Conformance, LayerNormAddForwardIsTheAddThenTheLayerNorm) {
  MIXTRAIN_FACETS(residual, ResidualFacet);
  MIXTRAIN_FACETS(layer_norm, LayerNormFacet);
  if (tested_layer_norm->version() < sdk::FacetVersion{1, 2})
    GTEST_SKIP() << "backend '" << GetParam().name << "' has layer_norm facet "
                 << sdk::to_string(tested_layer_norm->version());
  const std::int64_t rows = 37, cols = 160;
  for (DType dt : {DType::fp32, DType::bf16, DType::fp16})
    for (DType yt : {DType::fp32, dt})
      for (bool in_place : {false, true}) {
        const std::vector<DType> dtypes{dt, dt, dt, yt};
        if (!tested_->capabilities().supports(dt) ||
            !tested_layer_norm->supports(sdk::LayerNormOp::layernorm_add_forward, dtypes))
          continue;
        const std::string what = std::string(sdk::dtype_name(dt)) + " into " +
                                 std::string(sdk::dtype_name(yt)) +
                                 (in_place ? ", the sum over a" : "");
        // A large mean against small deviations: the sum's rounding shows in the statistics.
        auto a = upload(random_values(rows * cols, 70, 20.f, 24.f), Shape{rows, cols}, dt);
        auto b = upload(random_values(rows * cols, 71, -1.f, 1.f), Shape{rows, cols}, dt);
        auto gamma = upload(random_values(cols, 72, 0.5f, 1.5f), Shape{cols});
        auto beta = upload(random_values(cols, 73), Shape{cols});
        auto sum = zeros(Shape{rows, cols}, dt);
        auto y = zeros(Shape{rows, cols}, yt);
        auto mean = zeros(Shape{rows}), rstd = zeros(Shape{rows});
        const Pair& s = in_place ? a : sum;
        const TensorView ref_xs[2] = {a.ref->view(), b.ref->view()};
        ref_residual->add(ref_xs, false, s.ref->view());
        ref_layer_norm->layernorm_forward(s.ref->view(), gamma.ref->view(), beta.ref->view(), 1e-5f,
                                          y.ref->view(), mean.ref->view(), rstd.ref->view());
        sdk::LayerNormAddArgs args;
        args.a = a.tested->view();
        args.b = b.tested->view();
        args.sum = s.tested->view();
        args.gamma = gamma.tested->view();
        args.beta = beta.tested->view();
        args.eps = 1e-5f;
        args.y = y.tested->view();
        args.mean = mean.tested->view();
        args.rstd = rstd.tested->view();
        tested_layer_norm->layernorm_add_forward(args);
        expect_close(s, 0.0, "the sum, " + what);
        expect_close(y, 1e-6, "y, " + what);
        expect_close(mean, 1e-6, "mean, " + what);
        expect_close(rstd, 1e-6, "rstd, " + what);
        if (in_place) continue;
        // y must be apart from a, b and the sum; a may be the sum but not partly overlap it.
        sdk::LayerNormAddArgs bad = args;
        bad.y = {args.a.data, args.a.dtype, args.y.shape};
        EXPECT_THROW(tested_layer_norm->layernorm_add_forward(bad), sdk::BackendError)
            << "y over a, " << what;
        bad = args;
        bad.y = {args.sum.data, args.sum.dtype, args.y.shape};
        EXPECT_THROW(tested_layer_norm->layernorm_add_forward(bad), sdk::BackendError)
            << "y over the sum, " << what;
        auto two = zeros(Shape{rows + 1, cols}, dt);  // rows [0, rows) and [1, rows + 1)
        bad = args;
        bad.sum = {two.tested->view().data, dt, Shape{rows, cols}};
        bad.a = {static_cast<char*>(two.tested->view().data) + sdk::dtype_size(dt) * cols, dt,
                 Shape{rows, cols}};
        EXPECT_THROW(tested_layer_norm->layernorm_add_forward(bad), sdk::BackendError)
            << "a partly over the sum, " << what;
        bad = args;
        bad.b = {args.b.data, dt, Shape{rows - 1, cols}};
        EXPECT_THROW(tested_layer_norm->layernorm_add_forward(bad), sdk::BackendError)
            << "b of another size, " << what;
        bad = args;
        bad.mean = {};
        EXPECT_THROW(tested_layer_norm->layernorm_add_forward(bad), sdk::BackendError)
            << "no mean, " << what;
      }
}

TEST_P(Conformance, SoftmaxCrossEntropy) {
  MIXTRAIN_FACETS(loss, LossFacet);
  const std::int64_t rows = 41, classes = 13;
  auto logits = upload(random_values(rows * classes, 12, -5.f, 5.f), Shape{rows, classes});
  std::vector<std::int32_t> labels(rows);
  for (std::int64_t i = 0; i < rows; ++i)
    labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7) % classes);
  DeviceTensor lr(*ref_, DType::int32, Shape{rows}), lt(*tested_, DType::int32, Shape{rows});
  ref_->copy_from_host(lr.view(), labels.data());
  tested_->copy_from_host(lt.view(), labels.data());
  auto loss = zeros(Shape{1});
  DeviceTensor cr(*ref_, DType::int32, Shape{1}), ct(*tested_, DType::int32, Shape{1});
  auto dl = zeros(Shape{rows, classes});
  ref_loss->softmax_cross_entropy(logits.ref->view(), lr.view(), 1024.f, 0.0f, loss.ref->view(),
                                  cr.view(), dl.ref->view());
  tested_loss->softmax_cross_entropy(logits.tested->view(), lt.view(), 1024.f, 0.0f,
                                     loss.tested->view(), ct.view(), dl.tested->view());
  expect_close(loss, 1e-6, "loss");
  expect_close(dl, 1e-6, "dlogits");
  std::int32_t c_ref = -1, c_tested = -2;
  ref_->copy_to_host(&c_ref, cr.view());
  tested_->copy_to_host(&c_tested, ct.view());
  EXPECT_EQ(c_ref, c_tested);
}

// Label smoothing (torch.nn.CrossEntropyLoss(label_smoothing=ε)): each backend's loss and
// gradient against a double reference of the smoothed targets, and against the reference
// backend; ε outside [0, 1] is refused by every backend.
TEST_P(Conformance, SoftmaxCrossEntropyWithLabelSmoothing) {
  MIXTRAIN_FACETS(loss, LossFacet);
  const std::int64_t rows = 37, classes = 19;
  const auto values = random_values(static_cast<std::size_t>(rows * classes), 16, -6.f, 6.f);
  auto logits = upload(values, Shape{rows, classes});
  std::vector<std::int32_t> labels(rows);
  for (std::int64_t i = 0; i < rows; ++i)
    labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 5 + 2) % classes);
  DeviceTensor lr(*ref_, DType::int32, Shape{rows}), lt(*tested_, DType::int32, Shape{rows});
  ref_->copy_from_host(lr.view(), labels.data());
  tested_->copy_from_host(lt.view(), labels.data());
  for (const float eps : {0.1f, 0.6f}) {
    SCOPED_TRACE("label_smoothing " + std::to_string(eps));
    auto loss = zeros(Shape{1});
    auto dl = zeros(Shape{rows, classes});
    const float grad_scale = 256.f;
    ref_loss->softmax_cross_entropy(logits.ref->view(), lr.view(), grad_scale, eps,
                                    loss.ref->view(), {}, dl.ref->view());
    tested_loss->softmax_cross_entropy(logits.tested->view(), lt.view(), grad_scale, eps,
                                       loss.tested->view(), {}, dl.tested->view());
    expect_close(loss, 1e-6, "smoothed loss");
    expect_close(dl, 1e-6, "smoothed dlogits");
    double want = 0.0;
    std::vector<double> dwant;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* z = values.data() + r * classes;
      double mx = z[0], sum = 0.0, zsum = 0.0;
      for (std::int64_t j = 0; j < classes; ++j) mx = std::max(mx, static_cast<double>(z[j]));
      for (std::int64_t j = 0; j < classes; ++j) sum += std::exp(z[j] - mx), zsum += z[j];
      const double lse = mx + std::log(sum);
      const auto y = labels[static_cast<std::size_t>(r)];
      want += lse - (1.0 - eps) * z[y] - eps / static_cast<double>(classes) * zsum;
      for (std::int64_t j = 0; j < classes; ++j) {
        const double t = (j == y ? 1.0 - eps : 0.0) + eps / static_cast<double>(classes);
        dwant.push_back((std::exp(z[j] - lse) - t) * grad_scale / static_cast<double>(rows));
      }
    }
    want /= static_cast<double>(rows);
    EXPECT_NEAR(tested_values(loss)[0], want, 1e-6 * want);
    const auto got = tested_values(dl);
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], dwant[i], 1e-5 * std::fabs(dwant[i]) + 1e-6) << "dlogits " << i;
  }
  auto loss = zeros(Shape{1});
  EXPECT_THROW(tested_loss->softmax_cross_entropy(logits.tested->view(), lt.view(), 1.f, 1.5f,
                                                  loss.tested->view(), {}, {}),
               sdk::BackendError);
  EXPECT_THROW(tested_loss->softmax_cross_entropy(logits.tested->view(), lt.view(), 1.f, -0.1f,
                                                  loss.tested->view(), {}, {}),
               sdk::BackendError);
}

TEST_P(Conformance, ReductionsAndNonFiniteChecks) {
  MIXTRAIN_FACETS(gradient_check, GradientCheckFacet);
  auto a = upload(random_values(1000, 13), Shape{1000});
  auto b = upload(random_values(333, 14), Shape{333});
  std::vector<TensorView> vr{a.ref->view(), b.ref->view()}, vt{a.tested->view(), b.tested->view()};
  const double want = ref_gradient_check->unscale_check_and_sum_squares(vr, 1.0f).sum_of_squares;
  EXPECT_NEAR(tested_gradient_check->unscale_check_and_sum_squares(vt, 1.0f).sum_of_squares, want,
              1e-9 * want);
  EXPECT_FALSE(tested_gradient_check->unscale_and_check_finite(vt, 0.5f));
  EXPECT_FALSE(ref_gradient_check->unscale_and_check_finite(vr, 0.5f));
  expect_close(a, 0, "unscaled values");
  EXPECT_EQ(tested_gradient_check->first_nonfinite(vt), -1);
  auto bad = random_values(333, 15);
  bad[200] = std::numeric_limits<float>::infinity();
  auto c = upload(bad, Shape{333});
  std::vector<TensorView> vt2{a.tested->view(), c.tested->view()};
  EXPECT_TRUE(tested_gradient_check->unscale_and_check_finite(vt2, 1.0f));
  EXPECT_EQ(tested_gradient_check->first_nonfinite(vt2), 1);
}

// gradient_check 1.2: the underflow diagnostic's tally, on the tested backend and the reference
// alike: zeros of either sign are not counted, a NaN counts as kept and never as flushed, an
// infinity is kept, and the threshold itself flushes. Large enough for every worker of a backend.
TEST_P(Conformance, CountUnderflowTalliesWhatTheThresholdFlushes) {
  MIXTRAIN_FACETS(gradient_check, GradientCheckFacet);
  if (!sdk::facet_serves<sdk::GradientCheckFacet>(tested_gradient_check, 2))
    GTEST_SKIP() << "backend '" << GetParam().name << "' has no count_underflow (1.2)";
  const float t = std::ldexp(1.0f, -134);  // bf16's: half its smallest subnormal
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            t,
                            -t,
                            std::nextafter(t, 1.0f),
                            std::nextafter(t, 0.0f),
                            std::numeric_limits<float>::denorm_min(),
                            1.0f};
  auto values = random_values(100003, 21, -1.0f, 1.0f);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i % 7 == 0) values[i] = specials[(i / 7) % std::size(specials)];
    if (i % 11 == 0) values[i] *= std::ldexp(1.0f, -130);  // tiny: some flush, some not
  }
  std::int64_t nonzero = 0, flushed = 0;
  for (const float v : values) {
    nonzero += v != 0.0f;
    flushed += v != 0.0f && std::fabs(v) <= t;
  }
  ASSERT_GT(flushed, 1000);
  auto a = upload(values, Shape{static_cast<std::int64_t>(values.size())});
  for (sdk::GradientCheckFacet* facet : {tested_gradient_check, ref_gradient_check}) {
    const sdk::UnderflowTally tally = facet->count_underflow(
        facet == tested_gradient_check ? a.tested->view() : a.ref->view(), t);
    EXPECT_EQ(tally.nonzero, nonzero);
    EXPECT_EQ(tally.flushed, flushed);
  }
  const auto after = tested_values(a);  // the tally only reads (NaN among them: compare bits)
  ASSERT_EQ(after.size(), values.size());
  EXPECT_EQ(std::memcmp(after.data(), values.data(), values.size() * sizeof(float)), 0);
  // Bad input: a threshold that is negative or not finite.
  for (const float bad :
       {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
    EXPECT_THROW(tested_gradient_check->count_underflow(a.tested->view(), bad), sdk::BackendError)
        << bad;
}

// The unscale updates every gradient at once: one listed twice, or two views that overlap, would
// be scaled by two workers together. Refused on every backend, before anything is scaled.
TEST_P(Conformance, UnscaleRefusesAGradientListedTwiceOrOverlapping) {
  MIXTRAIN_FACETS(gradient_check, GradientCheckFacet);
  const auto values = random_values(1000, 18);
  auto a = upload(values, Shape{1000});
  auto b = upload(random_values(10, 19), Shape{10});
  const TensorView whole = a.tested->view();
  TensorView tail = whole;
  tail.data = static_cast<float*>(whole.data) + 500;
  tail.shape = Shape{500};
  for (const std::vector<TensorView>& grads :
       {std::vector<TensorView>{whole, b.tested->view(), whole},
        std::vector<TensorView>{tail, b.tested->view(), whole}}) {
    EXPECT_THROW(tested_gradient_check->unscale_and_check_finite(grads, 0.5f), sdk::BackendError);
    EXPECT_THROW(tested_gradient_check->unscale_check_and_sum_squares(grads, 0.5f),
                 sdk::BackendError);
  }
  EXPECT_EQ(tested_values(a), values) << "nothing was scaled";
}

TEST_P(Conformance, UnscaleWithNormEqualsTheTwoCallsInTurn) {
  MIXTRAIN_FACETS(gradient_check, GradientCheckFacet);
  // The fused form must unscale as unscale_and_check_finite does, on the same backend bit for bit,
  // and its sum of squares must agree with one computed here from the unscaled values and with
  // the reference's.
  const auto va = random_values(5000, 16, -8.f, 8.f), vb = random_values(777, 17, -8.f, 8.f);
  auto a1 = upload(va, Shape{5000}), b1 = upload(vb, Shape{777});
  auto a2 = upload(va, Shape{5000}), b2 = upload(vb, Shape{777});
  std::vector<TensorView> fused{a1.tested->view(), b1.tested->view()};
  std::vector<TensorView> apart{a2.tested->view(), b2.tested->view()};
  std::vector<TensorView> ref{a1.ref->view(), b1.ref->view()};
  const auto r = tested_gradient_check->unscale_check_and_sum_squares(fused, 0.25f);
  const bool found = tested_gradient_check->unscale_and_check_finite(apart, 0.25f);
  EXPECT_EQ(r.found_inf, found);
  EXPECT_FALSE(r.found_inf);
  EXPECT_EQ(tested_values(a1), tested_values(a2));
  double sum = 0.0;
  for (const Pair* p : {&a1, &b1})
    for (float x : tested_values(*p)) sum += static_cast<double>(x) * x;
  EXPECT_NEAR(r.sum_of_squares, sum, 1e-9 * sum);
  const auto rr = ref_gradient_check->unscale_check_and_sum_squares(ref, 0.25f);
  EXPECT_NEAR(r.sum_of_squares, rr.sum_of_squares, 1e-9 * rr.sum_of_squares);
  auto bad = vb;
  bad[5] = std::numeric_limits<float>::quiet_NaN();
  auto c = upload(bad, Shape{777});
  std::vector<TensorView> with_nan{a1.tested->view(), c.tested->view()};
  const auto rn = tested_gradient_check->unscale_check_and_sum_squares(with_nan, 1.0f);
  EXPECT_TRUE(rn.found_inf);
  EXPECT_FALSE(std::isfinite(rn.sum_of_squares));
}

TEST_P(Conformance, FusedOptimizerUpdates) {
  MIXTRAIN_FACETS(optimizer, OptimizerFacet);
  const std::int64_t n = 2053;
  auto master = upload(random_values(n, 16), Shape{n});
  auto grad = upload(random_values(n, 17), Shape{n});
  auto m = zeros(Shape{n}), v = zeros(Shape{n});
  auto working = zeros(Shape{n}, DType::bf16);
  sdk::AdamWHyper h;
  h.lr = 1e-2f;
  for (std::int64_t step = 1; step <= 3; ++step) {
    h.step = step;
    sdk::ParamTensors pr{master.ref->view(), grad.ref->view(), working.ref->view(), m.ref->view(),
                         v.ref->view()};
    sdk::ParamTensors pt{master.tested->view(), grad.tested->view(), working.tested->view(),
                         m.tested->view(), v.tested->view()};
    ref_optimizer->adamw_update(h, std::span<const sdk::ParamTensors>(&pr, 1));
    tested_optimizer->adamw_update(h, std::span<const sdk::ParamTensors>(&pt, 1));
  }
  expect_close(master, 1e-6, "adamw master");
  expect_close(v, 1e-6, "adamw exp_avg_sq");
  expect_close(working, 1e-2,
               "bf16 working copy");  // one bf16 ulp where masters differ in the last bit
  sdk::SgdHyper s;
  s.momentum = 0.9f;
  s.nesterov = true;
  s.weight_decay = 1e-3f;
  for (int step = 0; step < 3; ++step) {
    s.first_step = step == 0;
    sdk::ParamTensors pr{master.ref->view(), grad.ref->view(), {}, m.ref->view(), {}};
    sdk::ParamTensors pt{master.tested->view(), grad.tested->view(), {}, m.tested->view(), {}};
    ref_optimizer->sgd_update(s, std::span<const sdk::ParamTensors>(&pr, 1));
    tested_optimizer->sgd_update(s, std::span<const sdk::ParamTensors>(&pt, 1));
  }
  expect_close(master, 1e-6, "sgd master");
}

// gradient_check 1.1 and optimizer 1.1 on the tested backend alone (the gated update, docs/
// architecture.md "One training step"): the queued check unscales and reports as
// unscale_check_and_sum_squares does, a gated update equals the plain one given the host's
// clipping coefficient, bit for bit, and a status with found_inf set makes it write nothing.
TEST_P(Conformance, GatedUpdatesEqualThePlainOnesWithTheHostsClipping) {
  MIXTRAIN_FACETS(gradient_check, GradientCheckFacet);
  MIXTRAIN_FACETS(optimizer, OptimizerFacet);
  const DType fp32_bf16[] = {DType::fp32, DType::bf16};
  if (!sdk::facet_serves<sdk::GradientCheckFacet>(tested_gradient_check, 1) ||
      !sdk::facet_serves<sdk::OptimizerFacet>(tested_optimizer, 1) ||
      !tested_optimizer->supports(sdk::OptimizerOp::adamw_update_gated, fp32_bf16) ||
      !tested_optimizer->supports(sdk::OptimizerOp::sgd_update_gated, fp32_bf16))
    GTEST_SKIP() << "backend '" << GetParam().name << "' has no gated update (1.1)";
  (void)ref_gradient_check;
  (void)ref_optimizer;
  const std::int64_t n = 3001;
  sdk::DeviceBackend& b = *tested_;
  DeviceTensor status(b, DType::int32, Shape{4});
  // Two copies of one parameter: the gated update writes one, the plain update the other.
  struct Param {
    std::unique_ptr<DeviceTensor> master, grad, working, m, v;
    sdk::ParamTensors view() const {
      return {master->view(), grad->view(), working->view(), m->view(), v->view()};
    }
  };
  const auto make = [&](std::uint32_t seed) {
    Param p;
    p.master = make_on(b, random_values(n, seed), Shape{n}, DType::fp32, 1.0f);
    p.grad = make_on(b, random_values(n, seed + 1, -4.f, 4.f), Shape{n}, DType::fp32, 1.0f);
    p.working = make_on(b, std::vector<float>(static_cast<std::size_t>(n), 0.0f), Shape{n},
                        DType::bf16, 1.0f);
    p.m = make_on(b, random_values(n, seed + 2), Shape{n}, DType::fp32, 1.0f);
    p.v = make_on(b, random_values(n, seed + 3, 0.f, 1.f), Shape{n}, DType::fp32, 1.0f);
    return p;
  };
  for (const bool adamw : {true, false}) {
    const std::string what = adamw ? "adamw" : "sgd";
    Param gated = make(40), plain = make(40);
    const TensorView gated_grad[] = {gated.grad->view()}, plain_grad[] = {plain.grad->view()};
    tested_gradient_check->queue_unscale_check(gated_grad, 0.5f, true, status.view());
    const auto want = tested_gradient_check->unscale_check_and_sum_squares(plain_grad, 0.5f);
    // Clip at half the norm, so the coefficient is not 1.
    const double max_norm = 0.5 * std::sqrt(want.sum_of_squares);
    const float coef = sdk::clip_coefficient(want.sum_of_squares, max_norm);
    ASSERT_LT(coef, 1.0f);
    const sdk::ParamTensors gp = gated.view(), pp = plain.view();
    const auto update = [&](const sdk::ParamTensors& p, float grad_scale,
                            const sdk::UpdateGate* gate) {
      const std::span<const sdk::ParamTensors> one(&p, 1);
      if (adamw) {
        sdk::AdamWHyper h;
        h.lr = 1e-2f;
        h.step = 3;
        h.grad_scale = grad_scale;
        if (gate != nullptr)
          tested_optimizer->adamw_update_gated(h, one, *gate);
        else
          tested_optimizer->adamw_update(h, one);
      } else {
        sdk::SgdHyper h;
        h.lr = 0.1f;
        h.momentum = 0.9f;
        h.first_step = false;
        h.grad_scale = grad_scale;
        if (gate != nullptr)
          tested_optimizer->sgd_update_gated(h, one, *gate);
        else
          tested_optimizer->sgd_update(h, one);
      }
    };
    const sdk::UpdateGate gate{status.view(), max_norm};
    update(gp, 7.0f, &gate);  // the hyperparameters' grad_scale is replaced by the gate's
    update(pp, coef, nullptr);
    const auto got = tested_gradient_check->queued_check_result();
    EXPECT_EQ(got.found_inf, want.found_inf) << what;
    EXPECT_FALSE(got.found_inf) << what;
    EXPECT_EQ(got.sum_of_squares, want.sum_of_squares) << what;
    for (auto [g, p, name] : {std::tuple{gated.master.get(), plain.master.get(), "master"},
                              std::tuple{gated.m.get(), plain.m.get(), "state1"},
                              std::tuple{gated.working.get(), plain.working.get(), "working"}})
      EXPECT_EQ(download(b, g->view()), download(b, p->view())) << what << " " << name;

    // An inf: found, and the gated update writes nothing.
    auto bad = download(b, gated.grad->view());
    bad[7] = std::numeric_limits<float>::infinity();
    b.copy_from_host(gated.grad->view(), bad.data());
    tested_gradient_check->queue_unscale_check(gated_grad, 1.0f, false, status.view());
    const auto master = download(b, gated.master->view()), m = download(b, gated.m->view());
    const auto working = download(b, gated.working->view());
    update(gp, 1.0f, &gate);
    EXPECT_TRUE(tested_gradient_check->queued_check_result().found_inf) << what;
    EXPECT_EQ(download(b, gated.master->view()), master) << what;
    EXPECT_EQ(download(b, gated.m->view()), m) << what;
    EXPECT_EQ(download(b, gated.working->view()), working) << what;
  }
  // Each queued check is read once; a status of another dtype is refused.
  EXPECT_THROW(tested_gradient_check->queued_check_result(), std::logic_error);
  DeviceTensor wrong(b, DType::fp32, Shape{4});
  EXPECT_THROW(tested_gradient_check->queue_unscale_check({}, 1.0f, false, wrong.view()),
               sdk::BackendError);
}

// gemm facet 1.5's backward epilogues against the reference backend's unfused ops: the GEMM in
// fp32, gelu's gradient in fp32, one rounding into C, then bias_grad of C as stored (dgrad of the
// layer after a gelu); and wgrad with the bias gradient as the row sums of op(A) = dyᵀ.

}  // namespace
}  // namespace mixtrain::conformance
