// The conformance tests: every DeviceBackend op, on the backend under test and on the reference,
// same inputs, tolerances from the formats.
#include "mixtrain/conformance/backend_conformance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "embedded_quickstart.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/core/train/trainer.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "mixtrain/sdk/support/float_formats.h"
#include "mixtrain/sdk/support/gradient_clipping.h"
#include "mixtrain/sdk/support/nf4.h"

namespace mixtrain::conformance {

namespace {
BackendFactory& reference_factory() {
  static BackendFactory f;
  return f;
}
std::vector<BackendUnderTest>& backends() {
  static std::vector<BackendUnderTest> b;
  return b;
}
}  // namespace

void set_reference(BackendFactory make) {
  reference_factory() = std::move(make);
}
void add_backend(std::string name, BackendFactory make, std::vector<std::string> config_overrides) {
  backends().push_back({std::move(name), std::move(make), std::move(config_overrides)});
}
const std::vector<BackendUnderTest>& registered_backends() {
  return backends();
}

namespace {

using sdk::DType;
using sdk::Shape;
using sdk::TensorView;

// A tensor on one backend, freed through it.
class DeviceTensor {
 public:
  DeviceTensor(sdk::DeviceBackend& b, DType dtype, Shape shape) : b_(&b) {
    view_ = {b.allocate(std::max<std::size_t>(
                 64, static_cast<std::size_t>(shape.numel()) * sdk::dtype_size(dtype))),
             dtype, shape};
  }
  ~DeviceTensor() { b_->deallocate(view_.data); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  const TensorView& view() const { return view_; }

 private:
  sdk::DeviceBackend* b_;
  TensorView view_;
};

std::vector<float> random_values(std::size_t n, unsigned seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Normwise relative difference: the right measure when only accumulation order differs.
double relative_difference(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// `ref_<name>` and `tested_<name>`: the two backends' facet; the test is skipped when the backend
// under test has none (a facet is optional), and fails when the reference lacks it.
#define MIXTRAIN_FACETS(var, Class)                                               \
  auto* ref_##var = sdk::facet<sdk::Class>(*ref_);                                \
  auto* tested_##var = sdk::facet<sdk::Class>(*tested_);                          \
  ASSERT_NE(ref_##var, nullptr) << "the reference backend has no " #var " facet"; \
  if (tested_##var == nullptr)                                                    \
  GTEST_SKIP() << "backend '" << GetParam().name << "' has no " #var " facet"

class Conformance : public ::testing::TestWithParam<BackendUnderTest> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(reference_factory()) << "set_reference() was not called before RUN_ALL_TESTS";
    try {
      tested_ = GetParam().make();
    } catch (const std::exception& e) {
      GTEST_SKIP() << "backend '" << GetParam().name << "' is unavailable here: " << e.what();
    }
    ref_ = reference_factory()();
  }

  // A pair of tensors holding the same fp32 values, then cast (by each backend) to `dtype`.
  struct Pair {
    std::unique_ptr<DeviceTensor> ref, tested;
  };
  Pair upload(const std::vector<float>& values, Shape shape, DType dtype = DType::fp32,
              float scale = 1.0f) {
    Pair p;
    p.ref = make_on(*ref_, values, shape, dtype, scale);
    p.tested = make_on(*tested_, values, shape, dtype, scale);
    return p;
  }
  static std::unique_ptr<DeviceTensor> make_on(sdk::DeviceBackend& b,
                                               const std::vector<float>& values, Shape shape,
                                               DType dtype, float scale) {
    auto f32 = std::make_unique<DeviceTensor>(b, DType::fp32, shape);
    b.copy_from_host(f32->view(), values.data());
    if (dtype == DType::fp32) return f32;
    auto out = std::make_unique<DeviceTensor>(b, dtype == DType::tf32 ? DType::fp32 : dtype, shape);
    sdk::CastArgs args;
    args.scale = scale;
    args.saturate = true;
    b.cast(f32->view(), out->view(), args);
    return out;
  }
  Pair zeros(Shape shape, DType dtype = DType::fp32) {
    return upload(std::vector<float>(static_cast<std::size_t>(shape.numel()), 0.0f), shape, dtype);
  }
  static std::vector<float> download(sdk::DeviceBackend& b, const TensorView& v) {
    DeviceTensor f32(b, DType::fp32, v.shape);
    if (v.dtype == DType::fp32) {
      std::vector<float> h(static_cast<std::size_t>(v.numel()));
      b.copy_to_host(h.data(), v);
      return h;
    }
    b.cast(v, f32.view());
    std::vector<float> h(static_cast<std::size_t>(v.numel()));
    b.copy_to_host(h.data(), f32.view());
    return h;
  }
  std::vector<float> ref_values(const Pair& p) { return download(*ref_, p.ref->view()); }
  std::vector<float> tested_values(const Pair& p) { return download(*tested_, p.tested->view()); }
  void expect_close(const Pair& p, double tolerance, const std::string& what) {
    EXPECT_LE(relative_difference(tested_values(p), ref_values(p)), tolerance) << what;
  }
  // One GEMM on both backends: `args` carries flags and scalars, the pairs the tensors (bias and
  // pre_activation may be null).
  void gemm_both(const sdk::GemmArgs& args, const Pair& a, const Pair& b, const Pair& c,
                 const Pair* bias = nullptr, const Pair* pre = nullptr) {
    for (int which : {0, 1}) {
      auto side = [&](const Pair& p) { return which == 0 ? p.ref->view() : p.tested->view(); };
      sdk::GemmArgs g = args;
      g.a.view = side(a);
      g.b.view = side(b);
      g.c = side(c);
      if (bias != nullptr) g.bias = side(*bias);
      if (pre != nullptr) g.pre_activation = side(*pre);
      sdk::facet<sdk::GemmFacet>(which == 0 ? *ref_ : *tested_)->gemm(g);
    }
  }

  std::shared_ptr<sdk::DeviceBackend> ref_, tested_;
};

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

TEST_P(Conformance, GemmEveryDeclaredDtypeAndTranspose) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  const std::int64_t m = 37, n = 29, k = 53;
  for (const auto& support : tested_->capabilities().gemm_inputs) {
    const DType dt = support.dtype;
    if (!ref_->capabilities().supports(dt) || dt == DType::int32) continue;
    // tf32 rounding may differ in tie handling between implementations; 16/8-bit inputs are
    // quantized identically by both backends' casts, so only accumulation order differs.
    const double tol = dt == DType::tf32 ? 2e-3 : 2e-5;
    const DType b_dt = dt == DType::fp8_e4m3 ? DType::fp8_e4m3 : dt;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Shape sa = ta ? Shape{k, m} : Shape{m, k};
        Shape sb = tb ? Shape{n, k} : Shape{k, n};
        auto a = upload(random_values(static_cast<std::size_t>(m * k), 2), sa, dt);
        auto b = upload(random_values(static_cast<std::size_t>(k * n), 3), sb, b_dt);
        auto c = upload(random_values(static_cast<std::size_t>(m * n), 4), Shape{m, n});
        auto bias = upload(random_values(static_cast<std::size_t>(n), 5), Shape{n});
        sdk::GemmArgs g;
        g.a.transpose = ta;
        g.b.transpose = tb;
        g.alpha = 1.5f;
        g.beta = 0.5f;
        g.compute = dt;
        gemm_both(g, a, b, c, &bias);
        expect_close(c, tol,
                     std::string(sdk::dtype_name(dt)) + (ta ? " At" : " A") + (tb ? " Bt" : " B"));
      }
  }
}

TEST_P(Conformance, GemmActivationEpilogue) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  // n = 64 meets cuBLASLt's aux rule (n % 8 == 0) so a GPU backend can fuse gelu with its
  // pre-activation; n = 29 takes the fp32-then-kernel route. Both must match the reference.
  const std::int64_t m = 45, k = 40;
  for (std::int64_t n : {std::int64_t{64}, std::int64_t{29}})
    for (DType out : {DType::fp32, DType::bf16, DType::fp16}) {
      if (!tested_->capabilities().supports(out)) continue;
      const DType in = out == DType::fp32 ? DType::fp32 : out;
      // One rounding of the output: the reference and the backend may differ by accumulation
      // order only, which can move a value across a rounding boundary.
      const double round_tol = out == DType::fp32 ? 2e-5 : (out == DType::bf16 ? 4e-3 : 1e-3);
      for (sdk::Activation act : {sdk::Activation::relu, sdk::Activation::gelu})
        for (bool with_pre : {false, true}) {
          // A GPU epilogue may evaluate gelu's tanh with a hardware approximation (~2^-11
          // relative), which is below bf16/fp16 rounding but above fp32 accumulation noise.
          const double tol = act == sdk::Activation::gelu && out == DType::fp32 ? 1e-4 : round_tol;
          auto a = upload(random_values(static_cast<std::size_t>(m * k), 6), Shape{m, k}, in);
          auto b = upload(random_values(static_cast<std::size_t>(n * k), 7), Shape{n, k}, in);
          auto bias = upload(random_values(static_cast<std::size_t>(n), 8), Shape{n});
          auto c = zeros(Shape{m, n}, out);
          auto pre = zeros(Shape{m, n}, out);
          sdk::GemmArgs g;
          g.b.transpose = true;
          g.has_activation = true;
          g.activation = act;
          gemm_both(g, a, b, c, &bias, with_pre ? &pre : nullptr);
          const std::string what = std::string(act == sdk::Activation::relu ? "relu" : "gelu") +
                                   " C " + std::string(sdk::dtype_name(out)) + " n " +
                                   std::to_string(n) + (with_pre ? " with pre_activation" : "");
          expect_close(c, tol, what);
          if (with_pre) expect_close(pre, tol, what + " (pre_activation)");
        }
    }
}

TEST_P(Conformance, GemmActivationEpilogueKeepsNaN) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  // A NaN in the GEMM result must survive the fused relu/gelu as the unfused kernels keep it
  // (a fused max(z, 0) that turned NaN into 0 would hide a non-finite step from found_inf).
  const std::int64_t m = 8, n = 32, k = 16;
  auto values = random_values(static_cast<std::size_t>(m * k), 9);
  values[2 * k + 5] = std::numeric_limits<float>::quiet_NaN();  // row 2 of A
  for (DType out : {DType::fp32, DType::bf16}) {
    if (!tested_->capabilities().supports(out)) continue;
    for (sdk::Activation act : {sdk::Activation::relu, sdk::Activation::gelu}) {
      auto a = upload(values, Shape{m, k}, out);
      auto b = upload(random_values(static_cast<std::size_t>(n * k), 10), Shape{n, k}, out);
      auto bias = upload(random_values(static_cast<std::size_t>(n), 11), Shape{n});
      auto c = zeros(Shape{m, n}, out);
      sdk::GemmArgs g;
      g.b.transpose = true;
      g.has_activation = true;
      g.activation = act;
      gemm_both(g, a, b, c, &bias);
      const auto want = ref_values(c), got = tested_values(c);
      for (std::size_t i = 0; i < want.size(); ++i)
        EXPECT_EQ(std::isnan(got[i]), std::isnan(want[i]))
            << (act == sdk::Activation::relu ? "relu" : "gelu") << " C " << sdk::dtype_name(out)
            << " element " << i;
      for (std::int64_t j = 0; j < n; ++j)
        EXPECT_TRUE(std::isnan(want[static_cast<std::size_t>(2 * n + j)]))
            << "reference, column " << j;
    }
  }
}

// The residual join (optional op): the FP32 sum rounded once, with and without the fused ReLU,
// NaN kept, into each storage dtype, from inputs of mixed dtypes, in place too.
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
TEST_P(Conformance, GemmGradientIsTheUnfusedOpsRoundedOnce) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  MIXTRAIN_FACETS(activation, ActivationFacet);
  if (tested_gemm->version() < sdk::FacetVersion{1, 5})
    GTEST_SKIP() << "backend '" << GetParam().name << "' has gemm facet "
                 << sdk::to_string(tested_gemm->version());
  const std::int64_t m = 37, k = 48;
  for (std::int64_t n : {std::int64_t{64}, std::int64_t{29}})
    for (DType dt : {DType::fp32, DType::bf16}) {
      if (!tested_->capabilities().supports(dt)) continue;
      if (!tested_gemm->supports(sdk::GemmOp::gemm_gradient, std::vector<DType>{dt, dt, dt}))
        continue;
      // gelu's tanh may be a hardware approximation on a GPU (~2^-11 relative, see
      // GemmActivationEpilogue), and gelu' magnifies it: over z in [-3, 3] about 2.7·ε
      // normwise, 1.3e-3 at ε = 2^-11 (cuBLASLt's DGELU epilogue takes the fp32 case at n = 64).
      // So 2e-3 for fp32's dz and its column sums; in bf16 one rounding of C dominates. The
      // wgrad below has no gelu and keeps its own bounds.
      const double tol = dt == DType::fp32 ? 2e-3 : 4e-3;
      const std::string what = std::string(sdk::dtype_name(dt)) + " n " + std::to_string(n);
      for (bool accumulate : {false, true}) {
        // dgrad: dz[m, n] = (dy[m, k] · W[k, n]) · gelu'(z), sums[n] (+)= Σ_m dz.
        auto dy = upload(random_values(static_cast<std::size_t>(m * k), 40), Shape{m, k}, dt);
        auto w = upload(random_values(static_cast<std::size_t>(k * n), 41), Shape{k, n}, dt);
        auto z =
            upload(random_values(static_cast<std::size_t>(m * n), 42, -3.f, 3.f), Shape{m, n}, dt);
        auto dz = zeros(Shape{m, n}, dt);
        auto dz32 = zeros(Shape{m, n});
        auto sums = upload(random_values(static_cast<std::size_t>(n), 43), Shape{n});
        sdk::GemmGradientArgs g;
        g.gemm.a.view = dy.tested->view();
        g.gemm.b.view = w.tested->view();
        g.gemm.c = dz.tested->view();
        g.gemm.alpha = 0.5f;
        g.gemm.compute = dt;
        g.has_activation_grad = true;
        g.pre_activation = z.tested->view();
        g.c_column_sums = sums.tested->view();
        g.accumulate_c_column_sums = accumulate;
        tested_gemm->gemm_gradient(g);
        sdk::GemmArgs r;
        r.a.view = dy.ref->view();
        r.b.view = w.ref->view();
        r.c = dz32.ref->view();
        r.alpha = 0.5f;
        r.compute = dt;
        ref_gemm->gemm(r);
        ref_activation->activation_backward(sdk::Activation::gelu, z.ref->view(), dz32.ref->view(),
                                            dz32.ref->view());
        ref_->cast(dz32.ref->view(), dz.ref->view());
        ref_activation->bias_grad(dz.ref->view(), sums.ref->view(), accumulate);
        expect_close(dz, tol, "dgrad with gelu's gradient, " + what);
        expect_close(sums, tol, "its column sums, " + what + (accumulate ? ", accumulated" : ""));

        // wgrad: dW[k, n] = dyᵀ · x, with dy [m, k] stored as A (transposed); sums[k] (+)= Σ_m dy.
        auto x = upload(random_values(static_cast<std::size_t>(m * n), 44), Shape{m, n}, dt);
        auto dw = upload(random_values(static_cast<std::size_t>(k * n), 45), Shape{k, n});
        auto dbias = upload(random_values(static_cast<std::size_t>(k), 46), Shape{k});
        sdk::GemmGradientArgs gw;
        gw.gemm.a.view = dy.tested->view();
        gw.gemm.a.transpose = true;
        gw.gemm.b.view = x.tested->view();
        gw.gemm.c = dw.tested->view();
        gw.gemm.beta = accumulate ? 1.0f : 0.0f;
        gw.gemm.compute = dt;
        gw.a_row_sums = dbias.tested->view();
        gw.accumulate_a_row_sums = accumulate;
        tested_gemm->gemm_gradient(gw);
        sdk::GemmArgs rw = gw.gemm;
        rw.a.view = dy.ref->view();
        rw.b.view = x.ref->view();
        rw.c = dw.ref->view();
        ref_gemm->gemm(rw);
        ref_activation->bias_grad(dy.ref->view(), dbias.ref->view(), accumulate);
        expect_close(dw, 2e-5, "wgrad, " + what);
        expect_close(dbias, 1e-6, "wgrad's row sums of dyᵀ, " + what);
      }
    }
}

TEST_P(Conformance, GemmGradientRejectsBadArguments) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  if (tested_gemm->version() < sdk::FacetVersion{1, 5} ||
      !tested_gemm->supports(sdk::GemmOp::gemm_gradient,
                             std::vector<DType>{DType::fp32, DType::fp32, DType::fp32}))
    GTEST_SKIP() << "backend '" << GetParam().name << "' has no gemm_gradient";
  auto a = upload(random_values(12, 50), Shape{3, 4});
  auto b = upload(random_values(20, 51), Shape{4, 5});
  auto c = zeros(Shape{3, 5});
  auto pre = zeros(Shape{3, 5});
  auto sums = zeros(Shape{5});
  auto good = [&] {
    sdk::GemmGradientArgs g;
    g.gemm.a.view = a.tested->view();
    g.gemm.b.view = b.tested->view();
    g.gemm.c = c.tested->view();
    g.has_activation_grad = true;
    g.pre_activation = pre.tested->view();
    return g;
  };
  EXPECT_NO_THROW(tested_gemm->gemm_gradient(good()));
  auto relu = good();
  relu.activation = sdk::Activation::relu;
  EXPECT_THROW(tested_gemm->gemm_gradient(relu), sdk::BackendError) << "relu is not defined";
  auto no_pre = good();
  no_pre.pre_activation = {};
  EXPECT_THROW(tested_gemm->gemm_gradient(no_pre), sdk::BackendError) << "gelu without z";
  auto short_pre = good();
  short_pre.pre_activation.shape = Shape{3, 4};
  EXPECT_THROW(tested_gemm->gemm_gradient(short_pre), sdk::BackendError) << "z of another shape";
  auto in_place = good();
  in_place.pre_activation = c.tested->view();
  EXPECT_THROW(tested_gemm->gemm_gradient(in_place), sdk::BackendError) << "z overlapping C";
  auto forward_bias = good();
  forward_bias.gemm.bias = sums.tested->view();
  EXPECT_THROW(tested_gemm->gemm_gradient(forward_bias), sdk::BackendError) << "a forward bias";
  auto row_sums = good();
  row_sums.a_row_sums = {sums.tested->view().data, DType::fp32, Shape{3}};
  EXPECT_THROW(tested_gemm->gemm_gradient(row_sums), sdk::BackendError) << "A not transposed";
  auto column_sums = good();
  column_sums.c_column_sums = {sums.tested->view().data, DType::fp32, Shape{4}};
  EXPECT_THROW(tested_gemm->gemm_gradient(column_sums), sdk::BackendError) << "sums of [4]";
}

// The FP8 codes of a cast_transpose output (or a cast), as bytes.
std::vector<std::uint8_t> codes_of(sdk::DeviceBackend& b, const TensorView& v) {
  std::vector<std::uint8_t> h(static_cast<std::size_t>(v.numel()));
  b.copy_to_host(h.data(), v);
  return h;
}

// How many elements (r, c) of `stored` [rows, cols] are not at (c, r) in `transposed`.
std::size_t transpose_mismatches(const std::vector<std::uint8_t>& transposed,
                                 const std::vector<std::uint8_t>& stored, std::int64_t rows,
                                 std::int64_t cols) {
  std::size_t wrong = 0;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      wrong += transposed[static_cast<std::size_t>(c * rows + r)] !=
               stored[static_cast<std::size_t>(r * cols + c)];
  return wrong;
}

// gemm 1.6: each layout is the backend's own cast of the source, byte for byte (and so the
// reference's: CastsAgreeBitForBit), the transposed one element (r, c) at (c, r); the amax folds in
// as cast's does. Shapes around the kernels' tiles and their 4-wide packs, both FP8 formats, with
// saturating values and a scale.
TEST_P(Conformance, CastTransposeIsTheCastAndItsTransposeFromOneRead) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  auto offered = [&](DType from, DType to) {
    return tested_gemm->version() >= sdk::FacetVersion{1, 6} &&
           tested_gemm->supports(sdk::GemmOp::cast_transpose, std::vector<DType>{from, to});
  };
  if (!offered(DType::bf16, DType::fp8_e4m3))
    GTEST_SKIP() << "backend '" << GetParam().name << "' offers no cast_transpose";
  // {132, 68} and {68, 1028}: the 4-wide packs with partial tiles in both directions.
  const std::pair<std::int64_t, std::int64_t> shapes[] = {
      {1, 1}, {4, 8}, {67, 45}, {64, 128}, {130, 3}, {3, 130}, {132, 68}, {68, 1028}};
  unsigned seed = 60;
  for (const auto& [rows, cols] : shapes)
    for (DType from : {DType::fp32, DType::bf16, DType::fp16})
      for (DType to : {DType::fp8_e4m3, DType::fp8_e5m2}) {
        if (!offered(from, to)) continue;
        const std::string what = std::string(sdk::dtype_name(from)) + " -> " +
                                 std::string(sdk::dtype_name(to)) + " [" + std::to_string(rows) +
                                 ", " + std::to_string(cols) + "]";
        SCOPED_TRACE(what);
        auto values = random_values(static_cast<std::size_t>(rows * cols), seed++, -300.f, 300.f);
        values[0] = 60000.f;  // saturates e4m3 (and e5m2 at scale 2)
        if (values.size() > 2) values[2] = -0.0f;
        if (values.size() > 3) values[3] = 1e-7f;  // below both formats' subnormals
        auto src = upload(values, Shape{rows, cols}, from);
        const TensorView s = src.tested->view();
        for (float scale : {1.0f, 2.0f}) {
          DeviceTensor want(*tested_, to, Shape{rows, cols});
          DeviceTensor want_ref(*ref_, to, Shape{rows, cols});
          DeviceTensor out(*tested_, to, Shape{rows, cols});
          DeviceTensor out_t(*tested_, to, Shape{cols, rows});
          auto amax = upload({0.0f, 0.0f}, Shape{2});
          sdk::CastArgs cast;
          cast.scale = scale;
          cast.saturate = true;
          cast.amax = {amax.tested->view().data, DType::fp32, Shape{1}};
          tested_->cast(s, want.view(), cast);
          sdk::CastArgs ref_cast = cast;
          ref_cast.amax = {};
          ref_->cast(src.ref->view(), want_ref.view(), ref_cast);
          sdk::CastTransposeArgs both;
          both.src = s;
          both.out = out.view();
          both.out_transposed = out_t.view();
          both.cast = cast;
          both.cast.amax = {static_cast<float*>(amax.tested->view().data) + 1, DType::fp32,
                            Shape{1}};
          tested_gemm->cast_transpose(both);
          const auto expected = codes_of(*tested_, want.view());
          EXPECT_EQ(expected, codes_of(*ref_, want_ref.view())) << "scale " << scale;
          EXPECT_EQ(codes_of(*tested_, out.view()), expected) << "scale " << scale;
          EXPECT_EQ(transpose_mismatches(codes_of(*tested_, out_t.view()), expected, rows, cols),
                    0u)
              << "scale " << scale;
          const auto amaxes = tested_values(amax);
          EXPECT_EQ(amaxes[1], amaxes[0]) << "the amax is cast's";
          EXPECT_EQ(amaxes[0], std::abs(tested_values(src)[0])) << "60000 as the source stores it";
        }
        // One layout alone; an amax that only grows.
        DeviceTensor only_t(*tested_, to, Shape{cols, rows});
        DeviceTensor out_ref(*tested_, to, Shape{rows, cols});
        auto amax = upload({1e6f}, Shape{1});
        sdk::CastTransposeArgs one;
        one.src = s;
        one.out_transposed = only_t.view();
        one.cast.saturate = true;
        one.cast.amax = amax.tested->view();
        tested_gemm->cast_transpose(one);
        sdk::CastTransposeArgs stored;
        stored.src = s;
        stored.out = out_ref.view();
        stored.cast.saturate = true;
        tested_gemm->cast_transpose(stored);
        EXPECT_EQ(transpose_mismatches(codes_of(*tested_, only_t.view()),
                                       codes_of(*tested_, out_ref.view()), rows, cols),
                  0u);
        EXPECT_EQ(tested_values(amax)[0], 1e6f);
      }
  // A NaN in the source makes the amax NaN, as cast's does.
  auto values = random_values(64 * 8, 70);
  values[77] = std::numeric_limits<float>::quiet_NaN();
  auto src = upload(values, Shape{64, 8}, DType::bf16);
  DeviceTensor out_t(*tested_, DType::fp8_e4m3, Shape{8, 64});
  auto amax = upload({0.0f}, Shape{1});
  sdk::CastTransposeArgs nan;
  nan.src = src.tested->view();
  nan.out_transposed = out_t.view();
  nan.cast.saturate = true;
  nan.cast.amax = amax.tested->view();
  tested_gemm->cast_transpose(nan);
  EXPECT_TRUE(std::isnan(tested_values(amax)[0]));
}

TEST_P(Conformance, CastTransposeRejectsBadArguments) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  if (tested_gemm->version() < sdk::FacetVersion{1, 6} ||
      !tested_gemm->supports(sdk::GemmOp::cast_transpose,
                             std::vector<DType>{DType::bf16, DType::fp8_e4m3}))
    GTEST_SKIP() << "backend '" << GetParam().name << "' offers no cast_transpose";
  auto src = upload(random_values(6 * 10, 71), Shape{6, 10}, DType::bf16);
  DeviceTensor out(*tested_, DType::fp8_e4m3, Shape{6, 10});
  DeviceTensor out_t(*tested_, DType::fp8_e4m3, Shape{10, 6});
  DeviceTensor e5(*tested_, DType::fp8_e5m2, Shape{10, 6});
  DeviceTensor wide(*tested_, DType::bf16, Shape{10, 6});
  auto good = [&] {
    sdk::CastTransposeArgs a;
    a.src = src.tested->view();
    a.out = out.view();
    a.out_transposed = out_t.view();
    return a;
  };
  EXPECT_NO_THROW(tested_gemm->cast_transpose(good()));
  auto none = good();
  none.out = {};
  none.out_transposed = {};
  EXPECT_THROW(tested_gemm->cast_transpose(none), sdk::BackendError) << "no output";
  auto unswapped = good();
  unswapped.out_transposed.shape = Shape{6, 10};
  EXPECT_THROW(tested_gemm->cast_transpose(unswapped), sdk::BackendError) << "[rows, cols]";
  auto short_out = good();
  short_out.out.shape = Shape{6, 9};
  EXPECT_THROW(tested_gemm->cast_transpose(short_out), sdk::BackendError) << "out [6, 9]";
  auto mixed = good();
  mixed.out_transposed = e5.view();
  EXPECT_THROW(tested_gemm->cast_transpose(mixed), sdk::BackendError) << "e4m3 and e5m2";
  auto not_fp8 = good();
  not_fp8.out_transposed = wide.view();
  EXPECT_THROW(tested_gemm->cast_transpose(not_fp8), sdk::BackendError) << "a bf16 output";
  auto fp8_src = good();
  fp8_src.src = out.view();
  fp8_src.out = {};
  EXPECT_THROW(tested_gemm->cast_transpose(fp8_src), sdk::BackendError) << "an fp8 source";
  auto overlapping = good();
  overlapping.out_transposed = {out.view().data, DType::fp8_e4m3, Shape{10, 6}};
  EXPECT_THROW(tested_gemm->cast_transpose(overlapping), sdk::BackendError) << "out = out_t";
  auto amax = upload({0.0f, 0.0f}, Shape{2});
  auto two = good();
  two.cast.amax = amax.tested->view();
  EXPECT_THROW(tested_gemm->cast_transpose(two), sdk::BackendError) << "an amax of [2]";
}

TEST_P(Conformance, GemmStridedBatchedEqualsOneGemmPerBatch) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  // Batch 3 of [m, k]·[n, k]ᵀ with a shared weight (stride_b = 0), checked against the reference
  // backend's batched call and against its single GEMMs, batch by batch.
  const std::int64_t batch = 3, m = 19, n = 24, k = 31;
  for (DType dt : {DType::fp32, DType::bf16}) {
    if (!tested_->capabilities().supports(dt)) continue;
    if (!tested_gemm->supports(sdk::GemmOp::gemm_strided_batched,
                               std::vector<DType>{dt, dt, DType::fp32}))
      continue;
    auto a =
        upload(random_values(static_cast<std::size_t>(batch * m * k), 30), Shape{batch * m, k}, dt);
    auto b = upload(random_values(static_cast<std::size_t>(n * k), 31), Shape{n, k}, dt);
    auto c =
        upload(random_values(static_cast<std::size_t>(batch * m * n), 32), Shape{batch * m, n});
    auto single =
        upload(random_values(static_cast<std::size_t>(batch * m * n), 32), Shape{batch * m, n});
    for (int which : {0, 1}) {
      auto side = [&](const Pair& p) { return which == 0 ? p.ref->view() : p.tested->view(); };
      sdk::GemmBatchedArgs g;
      g.gemm.a.view = {side(a).data, dt, Shape{m, k}};
      g.gemm.b.view = side(b);
      g.gemm.b.transpose = true;
      g.gemm.c = {side(c).data, DType::fp32, Shape{m, n}};
      g.gemm.alpha = 0.75f;
      g.gemm.beta = 0.5f;
      g.batch = batch;
      g.stride_a = m * k;
      g.stride_b = 0;
      g.stride_c = m * n;
      (which == 0 ? ref_gemm : tested_gemm)->gemm_strided_batched(g);
    }
    for (std::int64_t i = 0; i < batch; ++i) {
      sdk::GemmArgs g;
      g.a.view = {static_cast<char*>(a.ref->view().data) +
                      i * m * k * static_cast<std::int64_t>(sdk::dtype_size(dt)),
                  dt, Shape{m, k}};
      g.b.view = b.ref->view();
      g.b.transpose = true;
      g.c = {single.ref->view().as<float>() + i * m * n, DType::fp32, Shape{m, n}};
      g.alpha = 0.75f;
      g.beta = 0.5f;
      ref_gemm->gemm(g);
    }
    const double tol = dt == DType::fp32 ? 2e-5 : 2e-5;
    expect_close(c, tol, std::string("batched ") + std::string(sdk::dtype_name(dt)));
    EXPECT_LE(relative_difference(tested_values(c), ref_values(single)), tol)
        << "batched vs one gemm per batch, " << sdk::dtype_name(dt);
  }
}

TEST_P(Conformance, GemmGroupedEqualsOneGemmPerMember) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  // gemm 1.1: three GEMMs of different shapes (and transposes) in one call, against the reference
  // backend's single GEMMs, member by member.
  struct Member {
    std::int64_t m, n, k;
    bool tb;
  };
  const Member members[] = {{7, 5, 9, false}, {16, 3, 4, true}, {1, 11, 6, false}};
  for (DType dt : {DType::fp32, DType::bf16}) {
    if (!tested_->capabilities().supports(dt)) continue;
    if (!tested_gemm->supports(sdk::GemmOp::gemm_grouped, std::vector<DType>{dt, dt, DType::fp32}))
      continue;
    std::vector<Pair> as, bs, cs;
    unsigned seed = 40;
    for (const Member& mb : members) {
      as.push_back(upload(random_values(static_cast<std::size_t>(mb.m * mb.k), seed++),
                          Shape{mb.m, mb.k}, dt));
      const Shape b_shape = mb.tb ? Shape{mb.n, mb.k} : Shape{mb.k, mb.n};
      bs.push_back(
          upload(random_values(static_cast<std::size_t>(mb.k * mb.n), seed++), b_shape, dt));
      cs.push_back(
          upload(random_values(static_cast<std::size_t>(mb.m * mb.n), seed++), Shape{mb.m, mb.n}));
    }
    for (int which : {0, 1}) {
      std::vector<sdk::GemmArgs> group;
      for (std::size_t i = 0; i < std::size(members); ++i) {
        auto side = [&](const Pair& p) { return which == 0 ? p.ref->view() : p.tested->view(); };
        sdk::GemmArgs g;
        g.a.view = side(as[i]);
        g.b.view = side(bs[i]);
        g.b.transpose = members[i].tb;
        g.c = side(cs[i]);
        g.alpha = 0.5f;
        g.beta = 0.25f;
        group.push_back(g);
      }
      if (which == 0)
        for (const auto& g : group) ref_gemm->gemm(g);  // the reference: one gemm per member
      else
        tested_gemm->gemm_grouped(group);
    }
    for (std::size_t i = 0; i < std::size(members); ++i)
      expect_close(cs[i], 2e-5,
                   "grouped member " + std::to_string(i) + " " + std::string(sdk::dtype_name(dt)));
  }
}

// --- attention, embedding and batched GEMM against plain double-precision references ---------

// The value `dtype` stores for v: RNE, as every backend's cast rounds (values here are in range).
float stored(double v, DType dtype) {
  const auto f = static_cast<float>(v);
  switch (dtype) {
    case DType::bf16:
      return sdk::decode_bf16(sdk::encode_bf16(f));
    case DType::fp16:
      return sdk::decode_fp16(sdk::encode_fp16(f));
    default:
      return f;
  }
}

// One unit in the last place relative to the value, per storage dtype.
double ulp(DType dtype) {
  return dtype == DType::bf16 ? 0x1p-7 : (dtype == DType::fp16 ? 0x1p-10 : 0x1p-23);
}

constexpr DType kStorageFloats[] = {DType::fp32, DType::bf16, DType::fp16};

std::string dtypes_text(std::initializer_list<DType> ts) {
  std::string s;
  for (DType t : ts) s += (s.empty() ? "" : "/") + std::string(sdk::dtype_name(t));
  return s;
}

TEST_P(Conformance, AttentionHeadPermutesEveryDtypePairWithACacheOffset) {
  MIXTRAIN_FACETS(attention, AttentionFacet);
  // x [N, T, P, H, D] = [2, 3, 3, 2, 8] into a cache y [P, N, H, 7, 8] at token offset 2: the
  // window gets x rounded once into y's dtype, every other row keeps its sentinel; merging the
  // window back gives y rounded once into x's dtype.
  sdk::HeadLayout l;
  l.batch = 2;
  l.tokens = 3;
  l.parts = 3;
  l.heads = 2;
  l.head_dim = 8;
  l.head_tokens = 7;
  l.head_offset = 2;
  const Shape xs{l.batch, l.tokens, l.parts * l.heads * l.head_dim};
  const Shape ys{l.parts * l.batch * l.heads, l.head_tokens, l.head_dim};
  const auto values = random_values(static_cast<std::size_t>(xs.numel()), 40, -3.f, 3.f);
  for (DType xt : kStorageFloats)
    for (DType yt : kStorageFloats) {
      const std::vector<DType> pair{xt, yt};
      if (!tested_attention->supports(sdk::AttentionOp::split_heads, pair) ||
          !tested_attention->supports(sdk::AttentionOp::merge_heads, pair))
        continue;
      const std::string what = dtypes_text({xt, yt});
      auto x = upload(values, xs, xt);
      auto y = upload(std::vector<float>(static_cast<std::size_t>(ys.numel()), 42.f), ys, yt);
      tested_attention->split_heads(x.tested->view(), l, y.tested->view());
      auto back = zeros(xs, xt);
      tested_attention->merge_heads(y.tested->view(), l, back.tested->view());
      std::vector<float> want_y(static_cast<std::size_t>(ys.numel()), 42.f);
      std::vector<float> want_back(values.size());
      for (std::int64_t n = 0; n < l.batch; ++n)
        for (std::int64_t t = 0; t < l.tokens; ++t)
          for (std::int64_t p = 0; p < l.parts; ++p)
            for (std::int64_t h = 0; h < l.heads; ++h)
              for (std::int64_t d = 0; d < l.head_dim; ++d) {
                const auto xi = static_cast<std::size_t>(
                    (((n * l.tokens + t) * l.parts + p) * l.heads + h) * l.head_dim + d);
                const auto yi = static_cast<std::size_t>(
                    (((p * l.batch + n) * l.heads + h) * l.head_tokens + l.head_offset + t) *
                        l.head_dim +
                    d);
                want_y[yi] = stored(stored(values[xi], xt), yt);
                want_back[xi] = stored(want_y[yi], xt);
              }
      EXPECT_EQ(tested_values(y), want_y) << "split_heads " << what;
      EXPECT_EQ(tested_values(back), want_back) << "merge_heads " << what;
    }
}

TEST_P(Conformance, AttentionSoftmaxForwardAndBackward) {
  MIXTRAIN_FACETS(attention, AttentionFacet);
  const std::vector<DType> fp32{DType::fp32};
  if (!tested_attention->supports(sdk::AttentionOp::softmax_forward, fp32) ||
      !tested_attention->supports(sdk::AttentionOp::softmax_backward, fp32))
    GTEST_SKIP() << "the attention facet does not support the fp32 softmax";
  const float scale = 0.35f;
  // Square causal (training), rows < cols causal (decoding over a cache, one and four new
  // tokens), rows < cols and square without a mask.
  for (const sdk::SoftmaxShape s :
       {sdk::SoftmaxShape{6, 17, 17, true}, sdk::SoftmaxShape{6, 1, 9, true},
        sdk::SoftmaxShape{6, 4, 9, true}, sdk::SoftmaxShape{6, 4, 9, false},
        sdk::SoftmaxShape{3, 33, 33, false}}) {
    const Shape shape{s.batch, s.rows, s.cols};
    const auto n = static_cast<std::size_t>(shape.numel());
    const auto scores = random_values(n, 41, -6.f, 6.f);
    const auto dprobs = random_values(n, 42);
    auto x = upload(scores, shape);
    auto p = zeros(shape);
    auto dp = upload(dprobs, shape);
    auto ds = zeros(shape);
    tested_attention->softmax_forward(x.tested->view(), s, scale, p.tested->view());
    tested_attention->softmax_backward(p.tested->view(), dp.tested->view(), s, scale,
                                       ds.tested->view());
    std::vector<float> want_p(n), want_ds(n);
    for (std::int64_t r = 0; r < s.batch * s.rows; ++r) {
      const std::int64_t i = r % s.rows;
      const std::int64_t visible = s.causal ? i + (s.cols - s.rows) + 1 : s.cols;
      const auto row = static_cast<std::size_t>(r * s.cols);
      double mx = -std::numeric_limits<double>::infinity(), sum = 0.0, dot = 0.0;
      for (std::int64_t j = 0; j < visible; ++j)
        mx = std::max(mx, double{scale} * scores[row + static_cast<std::size_t>(j)]);
      for (std::int64_t j = 0; j < visible; ++j)
        sum += std::exp(double{scale} * scores[row + static_cast<std::size_t>(j)] - mx);
      std::vector<double> prob(static_cast<std::size_t>(s.cols), 0.0);
      for (std::int64_t j = 0; j < visible; ++j) {
        const auto c = static_cast<std::size_t>(j);
        prob[c] = std::exp(double{scale} * scores[row + c] - mx) / sum;
        dot += prob[c] * dprobs[row + c];
      }
      for (std::int64_t j = 0; j < s.cols; ++j) {
        const auto c = static_cast<std::size_t>(j);
        want_p[row + c] = static_cast<float>(prob[c]);
        want_ds[row + c] = static_cast<float>(double{scale} * prob[c] * (dprobs[row + c] - dot));
      }
    }
    const std::string what = "batch " + std::to_string(s.batch) + " rows " +
                             std::to_string(s.rows) + " cols " + std::to_string(s.cols) +
                             (s.causal ? " causal" : " full");
    const auto got_p = tested_values(p), got_ds = tested_values(ds);
    EXPECT_LE(relative_difference(got_p, want_p), 1e-5) << "softmax_forward " << what;
    EXPECT_LE(relative_difference(got_ds, want_ds), 1e-4) << "softmax_backward " << what;
    for (std::size_t i = 0; i < n; ++i)
      if (want_p[i] == 0.0f) {  // masked (no visible probability underflows at these scores)
        EXPECT_EQ(got_p[i], 0.0f) << "masked probability, " << what << " element " << i;
        EXPECT_EQ(got_ds[i], 0.0f) << "masked gradient, " << what << " element " << i;
      }
  }
}

// Flash attention (attention facet 1.1) against a double-precision reference of the same causal
// attention, from the values each dtype stores. Several heads and sequences, T past one tile of
// 64 and not a multiple of it, T = 1, an odd-sized head.
struct FlashCase {
  std::int64_t batch, tokens, heads, head_dim;
};

// What flash_forward and flash_backward should give, in double: out [N, T, H, D], lse [N, H, T],
// dqkv [N, T, 3, H, D].
struct FlashReference {
  std::vector<float> out, lse, dqkv;
};

FlashReference flash_reference(const FlashCase& c, const std::vector<double>& qkv,
                               const std::vector<double>& dout, double scale) {
  const std::int64_t t_len = c.tokens, h_n = c.heads, d = c.head_dim;
  auto at = [&](std::int64_t n, std::int64_t t, std::int64_t p, std::int64_t h, std::int64_t e) {
    return static_cast<std::size_t>((((n * t_len + t) * 3 + p) * h_n + h) * d + e);
  };
  auto o_at = [&](std::int64_t n, std::int64_t t, std::int64_t h, std::int64_t e) {
    return static_cast<std::size_t>(((n * t_len + t) * h_n + h) * d + e);
  };
  FlashReference r;
  r.out.resize(static_cast<std::size_t>(c.batch * t_len * h_n * d));
  r.lse.resize(static_cast<std::size_t>(c.batch * h_n * t_len));
  std::vector<double> dqkv(qkv.size(), 0.0);
  const auto tn = static_cast<std::size_t>(t_len);
  for (std::int64_t n = 0; n < c.batch; ++n)
    for (std::int64_t h = 0; h < h_n; ++h) {
      std::vector<double> p(tn * tn, 0.0), dp(tn * tn, 0.0);
      for (std::int64_t i = 0; i < t_len; ++i) {
        double mx = -std::numeric_limits<double>::infinity(), sum = 0.0;
        std::vector<double> s(tn, 0.0);
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (std::int64_t e = 0; e < d; ++e)
            dot += qkv[at(n, i, 0, h, e)] * qkv[at(n, j, 1, h, e)];
          s[static_cast<std::size_t>(j)] = scale * dot;
          mx = std::max(mx, scale * dot);
        }
        for (std::int64_t j = 0; j <= i; ++j) sum += std::exp(s[static_cast<std::size_t>(j)] - mx);
        r.lse[static_cast<std::size_t>((n * h_n + h) * t_len + i)] =
            static_cast<float>(mx + std::log(sum));
        for (std::int64_t j = 0; j <= i; ++j)
          p[static_cast<std::size_t>(i) * tn + static_cast<std::size_t>(j)] =
              std::exp(s[static_cast<std::size_t>(j)] - mx) / sum;
        for (std::int64_t e = 0; e < d; ++e) {
          double o = 0.0;
          for (std::int64_t j = 0; j <= i; ++j)
            o += p[static_cast<std::size_t>(i) * tn + static_cast<std::size_t>(j)] *
                 qkv[at(n, j, 2, h, e)];
          r.out[o_at(n, i, h, e)] = static_cast<float>(o);
        }
      }
      // dP = dO·vᵀ, dS = P∘(dP − rowsum(P∘dP))·scale, dq = dS·k, dk = dSᵀ·q, dv = Pᵀ·dO.
      for (std::int64_t i = 0; i < t_len; ++i) {
        double delta = 0.0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (std::int64_t e = 0; e < d; ++e)
            dot += dout[o_at(n, i, h, e)] * qkv[at(n, j, 2, h, e)];
          const std::size_t ij = static_cast<std::size_t>(i) * tn + static_cast<std::size_t>(j);
          dp[ij] = dot;
          delta += p[ij] * dot;
        }
        for (std::int64_t j = 0; j <= i; ++j) {
          const std::size_t ij = static_cast<std::size_t>(i) * tn + static_cast<std::size_t>(j);
          const double ds = p[ij] * (dp[ij] - delta) * scale;
          for (std::int64_t e = 0; e < d; ++e) {
            dqkv[at(n, i, 0, h, e)] += ds * qkv[at(n, j, 1, h, e)];
            dqkv[at(n, j, 1, h, e)] += ds * qkv[at(n, i, 0, h, e)];
            dqkv[at(n, j, 2, h, e)] += p[ij] * dout[o_at(n, i, h, e)];
          }
        }
      }
    }
  r.dqkv.assign(dqkv.begin(), dqkv.end());
  return r;
}

TEST_P(Conformance, FlashAttentionForwardAndBackwardAgainstADoubleReference) {
  MIXTRAIN_FACETS(attention, AttentionFacet);
  if (tested_attention->version() < sdk::FacetVersion{1, 1})
    GTEST_SKIP() << "attention facet " << sdk::to_string(tested_attention->version())
                 << " predates flash attention (1.1)";
  for (const FlashCase c :
       {FlashCase{2, 70, 3, 24}, FlashCase{1, 1, 2, 8}, FlashCase{1, 129, 1, 16}})
    for (DType dt : kStorageFloats) {
      const std::vector<DType> fwd{dt}, bwd{dt, dt};
      if (!tested_attention->supports(sdk::AttentionOp::flash_forward, fwd) ||
          !tested_attention->supports(sdk::AttentionOp::flash_backward, bwd))
        continue;
      // 1.2: a shape the backend's fused kernel has no variant for (the host runs it unfused).
      if (tested_attention->version() >= sdk::FacetVersion{1, 2} &&
          !tested_attention->flash_refusal({0, c.tokens, c.heads, c.head_dim, 3, 0, 0}, dt).empty())
        continue;
      const std::string what = std::string(sdk::dtype_name(dt)) + " N " + std::to_string(c.batch) +
                               " T " + std::to_string(c.tokens) + " H " + std::to_string(c.heads) +
                               " D " + std::to_string(c.head_dim);
      const std::int64_t rows = c.batch * c.tokens, width = c.heads * c.head_dim;
      const Shape qkv_shape{c.batch, c.tokens, 3 * width}, out_shape{c.batch, c.tokens, width};
      const auto qkv_values =
          random_values(static_cast<std::size_t>(rows * 3 * width), 71, -2.f, 2.f);
      const auto dout_values = random_values(static_cast<std::size_t>(rows * width), 72);
      std::vector<double> q_stored(qkv_values.size()), g_stored(dout_values.size());
      for (std::size_t i = 0; i < q_stored.size(); ++i) q_stored[i] = stored(qkv_values[i], dt);
      for (std::size_t i = 0; i < g_stored.size(); ++i) g_stored[i] = stored(dout_values[i], dt);
      const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
      const auto want = flash_reference(c, q_stored, g_stored, scale);

      auto qkv = upload(qkv_values, qkv_shape, dt);
      auto dout = upload(dout_values, out_shape, dt);
      auto out = zeros(out_shape, dt);
      auto lse = zeros(Shape{c.batch, c.heads, c.tokens});
      auto dqkv = zeros(qkv_shape, dt);
      const sdk::HeadLayout l{c.batch, c.tokens, c.heads, c.head_dim, 3, 0, 0};
      tested_attention->flash_forward(qkv.tested->view(), l, scale, out.tested->view(),
                                      lse.tested->view());
      tested_attention->flash_backward(qkv.tested->view(), out.tested->view(), dout.tested->view(),
                                       lse.tested->view(), l, scale, dqkv.tested->view());
      // One rounding of the output (half an ulp of dt) over FP32 sums of about T + D terms, and
      // one of the probabilities before P·v, which the contract lets a Tensor Core kernel make
      // (FlashAttention does; exact for fp32, half an ulp of dt otherwise). The gradients add a
      // rounding of their own and one of the score gradient before its products with q and k,
      // and D_i = Σ dO·O reads the rounded output (half an ulp each), over a chain of four such
      // sums.
      const double fp32_sums = static_cast<double>(c.tokens + c.head_dim) * 0x1p-24;
      const double intermediate = dt == DType::fp32 ? 0.0 : ulp(dt) / 2;
      EXPECT_LE(relative_difference(tested_values(out), want.out),
                ulp(dt) / 2 + intermediate + fp32_sums)
          << "flash_forward out, " << what;
      EXPECT_LE(relative_difference(tested_values(lse), want.lse), 1e-6 + fp32_sums)
          << "flash_forward lse, " << what;
      EXPECT_LE(relative_difference(tested_values(dqkv), want.dqkv),
                ulp(dt) + 2 * intermediate + 4 * fp32_sums)
          << "flash_backward dqkv, " << what;
      // Deterministic: the same call again gives the same bits.
      auto again = zeros(qkv_shape, dt);
      tested_attention->flash_backward(qkv.tested->view(), out.tested->view(), dout.tested->view(),
                                       lse.tested->view(), l, scale, again.tested->view());
      EXPECT_EQ(tested_values(again), tested_values(dqkv)) << "flash_backward again, " << what;
    }
}

// attention 1.3: a decode step over a KV cache is the last rows of causal attention over the
// whole sequence (the double reference above): a prefill (start 0) and steps whose keys cross a
// tile of 64, from a cache that split_heads filled, into an output of the cache's dtype or fp32;
// the same bits on a second call; and its argument checks. Starts 50 and 130 put queries that
// see nothing of the last key tile beside queries that do (the CPU's tiles of 64); length 203
// crosses the CUDA kernel's tiles of 128, so its running maximum is rescaled.
TEST_P(Conformance, FlashDecodeIsTheLastRowsOfCausalAttention) {
  MIXTRAIN_FACETS(attention, AttentionFacet);
  if (tested_attention->version() < sdk::FacetVersion{1, 3})
    GTEST_SKIP() << "attention facet " << sdk::to_string(tested_attention->version())
                 << " predates flash_decode (1.3)";
  struct DecodeCase {
    std::int64_t len, cap;
    std::vector<std::int64_t> starts;
  };
  const DecodeCase cases[] = {{77, 90, {0, 50, 70, 76}}, {203, 210, {0, 130, 190, 202}}};
  for (const DecodeCase& dc : cases) {
    const std::int64_t heads = 3, d = 20, cap = dc.cap, len = dc.len;
    const FlashCase whole{1, len, heads, d};
    const std::int64_t width = heads * d;
    const auto qkv_values = random_values(static_cast<std::size_t>(len * 3 * width), 81, -2.f, 2.f);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    for (DType dt : kStorageFloats)
      for (DType ot : {dt, DType::fp32})
        for (std::int64_t start : dc.starts) {
          const std::vector<DType> dtypes{dt, ot};
          if (!tested_attention->supports(sdk::AttentionOp::flash_decode, dtypes)) continue;
          const std::int64_t rows = len - start;
          const std::string what = std::string(sdk::dtype_name(dt)) + " into " +
                                   std::string(sdk::dtype_name(ot)) + ", queries [" +
                                   std::to_string(start) + ", " + std::to_string(len) + ")";
          std::vector<double> stored_qkv(qkv_values.size());
          for (std::size_t i = 0; i < stored_qkv.size(); ++i)
            stored_qkv[i] = stored(qkv_values[i], dt);
          const auto want_all = flash_reference(
              whole, stored_qkv, std::vector<double>(static_cast<std::size_t>(len * width)), scale);
          const std::vector<float> want(want_all.out.begin() + start * width, want_all.out.end());
          auto qkv = upload(qkv_values, Shape{1, len, 3 * width}, dt);
          auto cache = zeros(Shape{3 * heads * cap * d}, dt);
          tested_attention->split_heads(qkv.tested->view(), {1, len, heads, d, 3, cap, 0},
                                        cache.tested->view());
          auto out = zeros(Shape{1, rows, width}, ot);
          const sdk::HeadLayout l{1, rows, heads, d, 3, cap, start};
          tested_attention->flash_decode(cache.tested->view(), l, scale, out.tested->view());
          const double fp32_sums = static_cast<double>(len + d) * 0x1p-24;
          EXPECT_LE(relative_difference(tested_values(out), want), ulp(ot) / 2 + fp32_sums) << what;
          auto again = zeros(Shape{1, rows, width}, ot);
          tested_attention->flash_decode(cache.tested->view(), l, scale, again.tested->view());
          EXPECT_EQ(tested_values(again), tested_values(out)) << "again, " << what;
          if (start != 70) continue;
          // Bad arguments: two sequences, queries past the cache, an output over the cache, one of
          // the wrong size.
          const TensorView c = cache.tested->view(), o = out.tested->view();
          EXPECT_THROW(
              tested_attention->flash_decode(c, {2, rows, heads, d, 3, cap, start}, scale, o),
              sdk::BackendError)
              << what;
          EXPECT_THROW(tested_attention->flash_decode(
                           c, {1, rows, heads, d, 3, cap, cap - rows + 1}, scale, o),
                       sdk::BackendError)
              << what;
          EXPECT_THROW(tested_attention->flash_decode(c, l, scale, {c.data, ot, o.shape}),
                       sdk::BackendError)
              << what;
          EXPECT_THROW(
              tested_attention->flash_decode(c, l, scale, {o.data, ot, Shape{1, rows - 1, width}}),
              sdk::BackendError)
              << what;
        }
  }
}

// The flash ops' argument checks, in the first storage dtype the backend's flash attention takes
// (fp32 on the CPU, bf16 on CUDA), at a shape it takes (head dimension 8).
TEST_P(Conformance, FlashAttentionRejectsMisshapenArguments) {
  MIXTRAIN_FACETS(attention, AttentionFacet);
  auto* f = tested_attention;
  const sdk::HeadLayout l{2, 5, 2, 8, 3, 0, 0};
  std::optional<DType> taken;
  if (f->version() >= sdk::FacetVersion{1, 1})
    for (DType dt : kStorageFloats) {
      const std::vector<DType> fwd{dt}, bwd{dt, dt};
      if (!f->supports(sdk::AttentionOp::flash_forward, fwd) ||
          !f->supports(sdk::AttentionOp::flash_backward, bwd))
        continue;
      if (f->version() >= sdk::FacetVersion{1, 2} && !f->flash_refusal(l, dt).empty()) continue;
      taken = dt;
      break;
    }
  if (!taken) GTEST_SKIP() << "the attention facet offers no flash attention at this shape";
  const DType dt = *taken, other = dt == DType::fp32 ? DType::bf16 : DType::fp32;
  auto qkv = zeros(Shape{2, 5, 48}, dt);
  auto out = zeros(Shape{2, 5, 16}, dt);
  auto lse = zeros(Shape{2, 2, 5});
  auto dqkv = zeros(Shape{2, 5, 48}, dt);
  auto short_out = zeros(Shape{2, 5, 15}, dt);
  auto other_out = zeros(Shape{2, 5, 16}, other);
  auto narrow_lse = zeros(Shape{2, 2, 5}, DType::fp16);
  auto other_dqkv = zeros(Shape{2, 5, 48}, other);
  const TensorView q = qkv.tested->view(), o = out.tested->view(), s = lse.tested->view();
  const std::string what = std::string(sdk::dtype_name(dt));
  EXPECT_NO_THROW(f->flash_forward(q, l, 0.5f, o, s)) << what;
  sdk::HeadLayout two_parts = l;
  two_parts.parts = 2;
  sdk::HeadLayout cached = l;
  cached.head_tokens = 9;
  EXPECT_THROW(f->flash_forward(q, two_parts, 0.5f, o, s), sdk::BackendError) << what;
  EXPECT_THROW(f->flash_forward(q, cached, 0.5f, o, s), sdk::BackendError) << what;
  EXPECT_THROW(f->flash_forward(q, l, 0.5f, short_out.tested->view(), s), sdk::BackendError)
      << what;
  EXPECT_THROW(f->flash_forward(q, l, 0.5f, other_out.tested->view(), s), sdk::BackendError)
      << what;
  EXPECT_THROW(f->flash_forward(q, l, 0.5f, o, narrow_lse.tested->view()), sdk::BackendError)
      << what;
  EXPECT_THROW(f->flash_forward(q, l, 0.5f, q, s), sdk::BackendError) << what;  // out overlaps qkv
  EXPECT_NO_THROW(f->flash_backward(q, o, o, s, l, 0.5f, dqkv.tested->view())) << what;
  // dqkv in another dtype than dout, or over qkv itself.
  EXPECT_THROW(f->flash_backward(q, o, o, s, l, 0.5f, other_dqkv.tested->view()), sdk::BackendError)
      << what;
  EXPECT_THROW(f->flash_backward(q, o, o, s, l, 0.5f, q), sdk::BackendError) << what;
}

TEST_P(Conformance, EmbeddingGatherWithAndWithoutAccumulate) {
  MIXTRAIN_FACETS(embedding, EmbeddingFacet);
  const std::int64_t vocab = 37, width = 24, rows = 29;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
  for (std::size_t r = 0; r < ids.size(); ++r)
    ids[r] = static_cast<std::int32_t>((r * 7 + 3) % vocab);
  ids[5] = ids[9] = 0;  // repeats and both ends of the table
  ids[6] = static_cast<std::int32_t>(vocab - 1);
  DeviceTensor id(*tested_, DType::int32, Shape{rows});
  tested_->copy_from_host(id.view(), ids.data());
  const auto table_values = random_values(static_cast<std::size_t>(vocab * width), 43, -4.f, 4.f);
  const auto old_values = random_values(static_cast<std::size_t>(rows * width), 44, -4.f, 4.f);
  for (DType tt : kStorageFloats)
    for (DType ot : kStorageFloats) {
      if (!tested_embedding->supports(sdk::EmbeddingOp::gather, std::vector<DType>{tt, ot}))
        continue;
      for (bool accumulate : {false, true}) {
        auto table = upload(table_values, Shape{vocab, width}, tt);
        auto out = upload(old_values, Shape{rows, width}, ot);
        tested_embedding->gather(id.view(), table.tested->view(), out.tested->view(), accumulate);
        const auto got = tested_values(out);
        std::int64_t bad = 0, first = -1;
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t j = 0; j < width; ++j) {
            const auto i = static_cast<std::size_t>(r * width + j);
            const double t = stored(table_values[static_cast<std::size_t>(
                                        ids[static_cast<std::size_t>(r)] * width + j)],
                                    tt);
            const double want = accumulate ? stored(old_values[i], ot) + t : t;
            // One rounding into out's dtype (double-then-dtype here may differ by one ulp from
            // fp32-then-dtype when accumulating).
            if (std::abs(got[i] - want) > ulp(ot) * std::abs(want)) {
              ++bad;
              if (first < 0) first = static_cast<std::int64_t>(i);
            }
          }
        EXPECT_EQ(bad, 0) << dtypes_text({tt, ot}) << (accumulate ? " accumulate" : "")
                          << ": first wrong element " << first << " (row " << first / width << ")";
      }
    }
}

TEST_P(Conformance, EmbeddingScatterAddRepeatedIdsBothBetas) {
  MIXTRAIN_FACETS(embedding, EmbeddingFacet);
  const std::int64_t vocab = 19, width = 40, rows = 300;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
  std::mt19937 rng(45);
  for (auto& v : ids)
    v = static_cast<std::int32_t>(rng() % 2 == 0 ? 3 : rng() % 12);  // ids >= 12 never occur
  DeviceTensor id(*tested_, DType::int32, Shape{rows});
  tested_->copy_from_host(id.view(), ids.data());
  const auto dy_values = random_values(static_cast<std::size_t>(rows * width), 46);
  const auto start = random_values(static_cast<std::size_t>(vocab * width), 47);
  for (DType dt : kStorageFloats) {
    if (!tested_embedding->supports(sdk::EmbeddingOp::scatter_add, std::vector<DType>{dt}))
      continue;
    auto dy = upload(dy_values, Shape{rows, width}, dt);
    for (float beta : {0.0f, 1.0f}) {
      auto table = upload(start, Shape{vocab, width});
      tested_embedding->scatter_add(id.view(), dy.tested->view(), table.tested->view(), beta);
      const auto got = tested_values(table);
      std::vector<double> sum(start.size(), 0.0);
      for (std::size_t r = 0; r < ids.size(); ++r)
        for (std::int64_t j = 0; j < width; ++j)
          sum[static_cast<std::size_t>(ids[r] * width + j)] += stored(
              dy_values[r * static_cast<std::size_t>(width) + static_cast<std::size_t>(j)], dt);
      std::vector<float> want(start.size());
      for (std::size_t i = 0; i < want.size(); ++i)
        want[i] = static_cast<float>(beta * static_cast<double>(start[i]) + sum[i]);
      const std::string what = std::string(sdk::dtype_name(dt)) + " beta " + std::to_string(beta);
      EXPECT_LE(relative_difference(got, want), 1e-6) << what;
      for (std::int64_t v = 12; v < vocab; ++v)  // rows no id names: 0, or as they were
        for (std::int64_t j = 0; j < width; ++j) {
          const auto i = static_cast<std::size_t>(v * width + j);
          EXPECT_EQ(got[i], beta == 0.0f ? 0.0f : start[i]) << what << " untouched row " << v;
        }
      // Deterministic: the same call again gives the same bits.
      auto again = upload(start, Shape{vocab, width});
      tested_embedding->scatter_add(id.view(), dy.tested->view(), again.tested->view(), beta);
      EXPECT_EQ(tested_values(again), got) << what << ", second run";
    }
  }
}

// The mask is the SDK's function of (key, index), so a backend must reproduce the reference's
// output bit for bit: same keep bits, one FP32 multiply, one rounding.
TEST_P(Conformance, DropoutMatchesTheSdkMaskBitForBitForwardAndBackward) {
  MIXTRAIN_FACETS(dropout, DropoutFacet);
  const std::int64_t rows = 97, cols = 131;  // odd sizes: no chunk or block lines up
  const auto values = random_values(static_cast<std::size_t>(rows * cols), 61, -3.f, 3.f);
  const sdk::DropoutKey key{0x1234'5678'9abc'def0ull, (7ull << 32) | 2u};
  for (const float p : {0.0f, 0.1f, 0.5f, 0.9f})
    for (DType xt : kStorageFloats)
      for (DType yt : kStorageFloats)
        for (const auto op : {sdk::DropoutOp::dropout_forward, sdk::DropoutOp::dropout_backward}) {
          if (!tested_dropout->supports(op, std::vector<DType>{xt, yt})) continue;
          auto x = upload(values, Shape{rows, cols}, xt);
          auto y = zeros(Shape{rows, cols}, yt);
          const bool fwd = op == sdk::DropoutOp::dropout_forward;
          (fwd ? ref_dropout->dropout_forward(x.ref->view(), y.ref->view(), p, key)
               : ref_dropout->dropout_backward(x.ref->view(), y.ref->view(), p, key));
          (fwd ? tested_dropout->dropout_forward(x.tested->view(), y.tested->view(), p, key)
               : tested_dropout->dropout_backward(x.tested->view(), y.tested->view(), p, key));
          const auto got = tested_values(y), want = ref_values(y);
          const auto in = tested_values(x);
          const std::uint32_t threshold = sdk::dropout_threshold(p);
          std::int64_t bad = 0, mask_bad = 0;
          for (std::size_t i = 0; i < got.size(); ++i) {
            if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) ++bad;
            const bool keep = sdk::dropout_keeps(key, i, threshold);
            if ((got[i] != 0.0f) != (keep && in[i] != 0.0f)) ++mask_bad;
          }
          const std::string what = std::string(sdk::op_name(op)) + " p = " + std::to_string(p) +
                                   " " + dtypes_text({xt, yt});
          EXPECT_EQ(bad, 0) << what << ": elements that differ from the reference";
          EXPECT_EQ(mask_bad, 0) << what << ": elements whose zero pattern is not the SDK mask";
        }
}

TEST_P(Conformance, GemmStridedBatchedMatchesADoubleReference) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  // Attention-like batches with every transpose pair, a broadcast operand (stride 0) and gaps
  // between batches; bf16 and fp32 operands, fp32 and bf16 C.
  struct Case {
    std::int64_t batch, m, n, k;
    bool ta, tb;
    std::int64_t pad_a, pad_b, pad_c;  // elements between batches; -1: broadcast (stride 0)
  };
  const std::vector<Case> cases = {
      {6, 17, 20, 16, false, true, 0, 0, 0},                                          // Q·Kᵀ
      {6, 17, 16, 20, false, false, 0, 0, 0},                                         // P·V
      {6, 17, 20, 16, true, false, 0, 0, 0},                                          // dKᵀ-like
      {6, 17, 20, 16, true, true, 5, 3, 7},   {5, 12, 9, 11, false, true, 0, -1, 0},  // shared B
      {5, 12, 9, 11, true, false, -1, 0, 4},                                          // shared A
  };
  for (const auto& [in, out] :
       {std::pair{DType::fp32, DType::fp32}, std::pair{DType::bf16, DType::fp32},
        std::pair{DType::bf16, DType::bf16}}) {
    if (!tested_gemm->supports(sdk::GemmOp::gemm_strided_batched, std::vector<DType>{in, in, out}))
      continue;
    for (const Case& g : cases) {
      const Shape sa = g.ta ? Shape{g.k, g.m} : Shape{g.m, g.k};
      const Shape sb = g.tb ? Shape{g.n, g.k} : Shape{g.k, g.n};
      const std::int64_t stride_a = g.pad_a < 0 ? 0 : sa.numel() + g.pad_a;
      const std::int64_t stride_b = g.pad_b < 0 ? 0 : sb.numel() + g.pad_b;
      const std::int64_t stride_c = g.m * g.n + g.pad_c;
      const std::int64_t span_a = stride_a * (g.batch - 1) + sa.numel();
      const std::int64_t span_b = stride_b * (g.batch - 1) + sb.numel();
      const std::int64_t span_c = stride_c * (g.batch - 1) + g.m * g.n;
      auto a = upload(random_values(static_cast<std::size_t>(span_a), 48), Shape{span_a}, in);
      auto b = upload(random_values(static_cast<std::size_t>(span_b), 49), Shape{span_b}, in);
      auto c = upload(random_values(static_cast<std::size_t>(span_c), 50), Shape{span_c}, out);
      const auto av = tested_values(a), bv = tested_values(b), c0 = tested_values(c);
      sdk::GemmBatchedArgs args;
      args.gemm.a = {{a.tested->view().data, in, sa}, g.ta};
      args.gemm.b = {{b.tested->view().data, in, sb}, g.tb};
      args.gemm.c = {c.tested->view().data, out, Shape{g.m, g.n}};
      args.gemm.alpha = 0.75f;
      args.gemm.beta = 0.5f;
      args.batch = g.batch;
      args.stride_a = stride_a;
      args.stride_b = stride_b;
      args.stride_c = stride_c;
      tested_gemm->gemm_strided_batched(args);
      const auto got = tested_values(c);
      std::vector<float> want = c0;  // gaps between C batches stay as they were
      for (std::int64_t q = 0; q < g.batch; ++q)
        for (std::int64_t i = 0; i < g.m; ++i)
          for (std::int64_t j = 0; j < g.n; ++j) {
            double acc = 0.0;
            for (std::int64_t p = 0; p < g.k; ++p) {
              const std::int64_t ai = q * stride_a + (g.ta ? p * g.m + i : i * g.k + p);
              const std::int64_t bi = q * stride_b + (g.tb ? j * g.k + p : p * g.n + j);
              acc += static_cast<double>(av[static_cast<std::size_t>(ai)]) *
                     bv[static_cast<std::size_t>(bi)];
            }
            const auto ci = static_cast<std::size_t>(q * stride_c + i * g.n + j);
            want[ci] = stored(0.75 * acc + 0.5 * c0[ci], out);
          }
      const std::string what = dtypes_text({in, in, out}) + " batch " + std::to_string(g.batch) +
                               (g.ta ? " At" : " A") + (g.tb ? " Bt" : " B") + " strides " +
                               std::to_string(stride_a) + "/" + std::to_string(stride_b) + "/" +
                               std::to_string(stride_c);
      // fp32 accumulation over k <= 20 (and one rounding of a bf16 C).
      EXPECT_LE(relative_difference(got, want), out == DType::fp32 ? 1e-6 : 4e-3) << what;
      for (std::int64_t q = 0; q + 1 < g.batch; ++q)
        for (std::int64_t e = g.m * g.n; e < stride_c; ++e)
          EXPECT_EQ(got[static_cast<std::size_t>(q * stride_c + e)],
                    c0[static_cast<std::size_t>(q * stride_c + e)])
              << what << ": the gap after batch " << q << " was written";
    }
  }
}

TEST_P(Conformance, ForeachOpsMatchAStraightforwardReference) {
  MIXTRAIN_FACETS(foreach, ForeachFacet);
  // Two tensors per list (sizes straddling a vector width), each op against a host loop.
  const std::vector<std::int64_t> sizes = {1003, 64};
  auto make = [&](unsigned seed, float lo, float hi) {
    std::vector<std::vector<float>> host;
    std::vector<Pair> dev;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      host.push_back(random_values(static_cast<std::size_t>(sizes[i]),
                                   seed + static_cast<unsigned>(i), lo, hi));
      dev.push_back(upload(host.back(), Shape{sizes[i]}));
    }
    return std::make_pair(host, std::move(dev));
  };
  auto views = [](const std::vector<Pair>& ps) {
    std::vector<TensorView> v;
    for (const auto& p : ps) v.push_back(p.tested->view());
    return v;
  };
  struct Case {
    const char* name;
    sdk::ForeachOp op;
    std::function<void(sdk::ForeachFacet&, std::span<const TensorView>, std::span<const TensorView>,
                       std::span<const TensorView>)>
        run;
    std::function<float(float, float, float)> ref;
  };
  const std::vector<Case> cases = {
      {"mul_scalar", sdk::ForeachOp::foreach_mul_scalar,
       [](auto& f, auto x, auto, auto) { f.foreach_mul_scalar(x, -1.5f); },
       [](float x, float, float) { return x * -1.5f; }},
      {"mul", sdk::ForeachOp::foreach_mul,
       [](auto& f, auto x, auto a, auto) { f.foreach_mul(x, a); },
       [](float x, float a, float) { return x * a; }},
      {"add_scalar", sdk::ForeachOp::foreach_add_scalar,
       [](auto& f, auto x, auto, auto) { f.foreach_add_scalar(x, 0.25f); },
       [](float x, float, float) { return x + 0.25f; }},
      {"add", sdk::ForeachOp::foreach_add,
       [](auto& f, auto x, auto a, auto) { f.foreach_add(x, a, -0.5f); },
       [](float x, float a, float) { return x + -0.5f * a; }},
      {"addcmul", sdk::ForeachOp::foreach_addcmul,
       [](auto& f, auto x, auto a, auto b) { f.foreach_addcmul(x, a, b, 0.1f); },
       [](float x, float a, float b) { return x + 0.1f * a * b; }},
      {"sqrt", sdk::ForeachOp::foreach_sqrt, [](auto& f, auto x, auto, auto) { f.foreach_sqrt(x); },
       [](float x, float, float) { return std::sqrt(x); }},
      {"sign", sdk::ForeachOp::foreach_sign, [](auto& f, auto x, auto, auto) { f.foreach_sign(x); },
       [](float x, float, float) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x); }},
      {"lerp", sdk::ForeachOp::foreach_lerp,
       [](auto& f, auto x, auto a, auto) { f.foreach_lerp(x, a, 0.1f); },
       [](float x, float a, float) { return x + 0.1f * (a - x); }},
      {"clamp", sdk::ForeachOp::foreach_clamp,
       [](auto& f, auto x, auto, auto) { f.foreach_clamp(x, -0.3f, 0.6f); },
       [](float x, float, float) { return x < -0.3f ? -0.3f : (x > 0.6f ? 0.6f : x); }},
  };
  for (const Case& c : cases) {
    const std::vector<DType> dtypes(3, DType::fp32);
    if (!tested_foreach->supports(c.op, std::span(dtypes).first(1))) {
      ADD_FAILURE() << "the foreach facet must support foreach_" << c.name << " on fp32";
      continue;
    }
    // sqrt reads non-negative values; the others see both signs, zeros and a NaN.
    const bool sqrt = c.op == sdk::ForeachOp::foreach_sqrt;
    auto [xh, xd] = make(40, sqrt ? 0.0f : -1.0f, 1.0f);
    if (!sqrt) {
      xh[0][3] = 0.0f;
      xh[0][4] = std::numeric_limits<float>::quiet_NaN();
      xd[0] = upload(xh[0], Shape{sizes[0]});
    }
    auto [ah, ad] = make(50, -1.0f, 1.0f);
    auto [bh, bd] = make(60, -1.0f, 1.0f);
    c.run(*tested_foreach, views(xd), views(ad), views(bd));
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      const auto got = tested_values(xd[t]);
      for (std::size_t i = 0; i < got.size(); ++i) {
        const float want = c.ref(xh[t][i], ah[t][i], bh[t][i]);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got[i])) << "foreach_" << c.name << " keeps NaN, tensor " << t;
          continue;
        }
        // One or two roundings; a backend may differ from this order by an ulp or so.
        EXPECT_NEAR(got[i], want, 2e-7f * std::max(1.0f, std::abs(want)))
            << "foreach_" << c.name << " tensor " << t << " element " << i;
      }
    }
  }
  // Lists of unequal length are refused.
  auto [xh, xd] = make(70, -1.0f, 1.0f);
  const auto x = views(xd);
  EXPECT_THROW(tested_foreach->foreach_add(x, std::span(x).first(1)), sdk::BackendError);
  EXPECT_THROW(tested_foreach->foreach_clamp(x, 1.0f, -1.0f), sdk::BackendError);
}

TEST_P(Conformance, MemoryStatsTrackAllocations) {
  auto before = tested_->memory_stats();
  {
    DeviceTensor t(*tested_, DType::fp32, Shape{1 << 20});
    auto during = tested_->memory_stats();
    EXPECT_GE(during.current_bytes, before.current_bytes + (4u << 20));
    EXPECT_GE(during.peak_bytes, during.current_bytes);
  }
  EXPECT_LE(tested_->memory_stats().current_bytes, before.current_bytes + 4096);
}

// NF4 decoding (quantized_weight facet): the codes and absmax of the SDK's reference quantizer,
// decoded into every storage dtype the backend declares, equal the reference's fp32 values
// rounded once into that dtype, bit for bit: whole and partial blocks, a zero block, odd counts.
// A short absmax or a null code pointer is a BackendError.
TEST_P(Conformance, Nf4DequantizeIsTheSdkReferenceRoundedOnce) {
  MIXTRAIN_FACETS(quantized_weight, QuantizedWeightFacet);
  for (const std::int64_t block : {64, 48})
    for (const Shape shape : {Shape{24, 40}, Shape{7, 37}, Shape{1, 1}}) {
      auto x = random_values(static_cast<std::size_t>(shape.numel()), 62, -0.1f, 0.1f);
      for (std::size_t i = 0; i < x.size() && i < 64; ++i) x[i] = 0.0f;  // a zero block
      const auto q = sdk::nf4_quantize(x, block);
      const auto want = sdk::nf4_dequantize(q);
      DeviceTensor codes(*tested_, DType::fp8_e4m3,
                         Shape{static_cast<std::int64_t>(q.codes.size())});
      tested_->copy_from_host(codes.view(), q.codes.data());
      auto absmax = make_on(*tested_, q.absmax, Shape{static_cast<std::int64_t>(q.absmax.size())},
                            DType::fp32, 1.0f);
      for (DType dt : kStorageFloats) {
        if (!tested_quantized_weight->supports(sdk::QuantizedWeightOp::dequantize_nf4,
                                               std::vector<DType>{DType::fp32, dt}))
          continue;
        const auto expected = upload(want, shape, dt);
        DeviceTensor out(*tested_, dt, shape);
        tested_quantized_weight->dequantize_nf4(codes.view().data, absmax->view(), block,
                                                out.view());
        const auto got = download(*tested_, out.view());
        const auto ref = ref_values(expected);
        EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0)
            << sdk::dtype_name(dt) << " " << shape.numel() << " elements, block " << block;
      }
    }
  DeviceTensor codes(*tested_, DType::fp8_e4m3, Shape{50});
  DeviceTensor absmax(*tested_, DType::fp32, Shape{1});  // 100 elements in blocks of 64 need 2
  DeviceTensor out(*tested_, DType::fp32, Shape{10, 10});
  EXPECT_THROW(
      tested_quantized_weight->dequantize_nf4(codes.view().data, absmax.view(), 64, out.view()),
      sdk::BackendError);
  EXPECT_THROW(tested_quantized_weight->dequantize_nf4(nullptr, absmax.view(), 128, out.view()),
               sdk::BackendError);
}

// Byte images (image_input facet): each byte decoded through its channel's row of the table and
// rounded once into y's dtype, bit for bit, for every storage dtype the backend declares: planes
// of odd length, one row, a table holding RNE ties and a value fp16 cannot hold; the host buffer
// is the caller's again when the call returns. An empty batch needs no pixels; a table of the
// wrong shape or null pixels are BackendErrors.
TEST_P(Conformance, DecodeImagesIsTheTableLookupRoundedOnce) {
  MIXTRAIN_FACETS(image_input, ImageInputFacet);
  const std::int64_t C = 3;
  auto values = random_values(static_cast<std::size_t>(C * 256), 71, -3.f, 3.f);
  values[1] = 1.0f + 0x1p-8f;         // a bf16 tie: rounds down to even
  values[2] = 1.0f + 3 * 0x1p-8f;     // a bf16 tie: rounds up to even
  values[256 + 3] = 1.0f + 0x1p-11f;  // an fp16 tie
  values[512 + 4] = 70000.0f;         // beyond fp16: infinity
  auto table = make_on(*tested_, values, Shape{C, 256}, DType::fp32, 1.0f);
  int decoded = 0;
  for (const auto& [rows, plane] : {std::pair<std::int64_t, std::int64_t>{4, 37}, {1, 64}}) {
    std::vector<std::uint8_t> pixels(static_cast<std::size_t>(rows * C * plane));
    const auto noise = random_values(pixels.size(), 72, 0.f, 256.f);
    for (std::size_t i = 0; i < pixels.size(); ++i)
      pixels[i] = static_cast<std::uint8_t>(std::min(255.f, noise[i]));
    pixels[0] = 1;
    pixels[1] = 2;
    pixels[static_cast<std::size_t>(plane)] = 3;
    pixels[static_cast<std::size_t>(2 * plane)] = 4;
    std::vector<float> want(pixels.size());
    for (std::size_t i = 0; i < want.size(); ++i)
      want[i] = values[(i / static_cast<std::size_t>(plane)) % C * 256 + pixels[i]];
    const Shape shape{rows, C * plane};
    for (DType dt : kStorageFloats) {
      if (!tested_image_input->supports(sdk::ImageInputOp::decode_images,
                                        std::vector<DType>{DType::fp32, dt}))
        continue;
      // Each value rounded once, RNE, overflowing to infinity (upload() would saturate).
      std::vector<float> ref(want.size());
      for (std::size_t i = 0; i < ref.size(); ++i)
        ref[i] = dt == DType::bf16   ? sdk::decode_bf16(sdk::encode_bf16(want[i]))
                 : dt == DType::fp16 ? sdk::decode_fp16(sdk::encode_fp16(want[i]))
                                     : want[i];
      DeviceTensor out(*tested_, dt, shape);
      std::vector<std::uint8_t> buffer = pixels;
      tested_image_input->decode_images({buffer.data(), rows, C, plane}, table->view(), out.view());
      std::fill(buffer.begin(), buffer.end(), std::uint8_t{0});  // free on return
      const auto got = download(*tested_, out.view());
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0)
          << sdk::dtype_name(dt) << " " << rows << " rows of " << plane << " pixels";
      if (dt == DType::fp16) {
        EXPECT_TRUE(std::isinf(got[static_cast<std::size_t>(2 * plane)]));
      }
      ++decoded;
    }
  }
  EXPECT_GT(decoded, 0) << "the image_input facet must decode into some storage dtype";
  DeviceTensor none(*tested_, DType::fp32, Shape{0, C * 5});
  EXPECT_NO_THROW(
      tested_image_input->decode_images({nullptr, 0, C, 5}, table->view(), none.view()));
  DeviceTensor out(*tested_, DType::fp32, Shape{2, C * 5});
  const std::vector<std::uint8_t> pixels(static_cast<std::size_t>(2 * C * 5), 9);
  auto narrow =
      make_on(*tested_, std::vector<float>(C * 255, 0.f), Shape{C, 255}, DType::fp32, 1.f);
  EXPECT_THROW(
      tested_image_input->decode_images({pixels.data(), 2, C, 5}, narrow->view(), out.view()),
      sdk::BackendError);
  EXPECT_THROW(tested_image_input->decode_images({nullptr, 2, C, 5}, table->view(), out.view()),
               sdk::BackendError);
  EXPECT_THROW(
      tested_image_input->decode_images({pixels.data(), 3, C, 5}, table->view(), out.view()),
      sdk::BackendError);
}

// Block-scaled weight decoding (quantized_weight 1.1): the SDK reference quantizer's codes and
// scales in every layout it has, stored as BlockScaledWeight stores them (E2M1 packed two per
// byte, E8M0 / E4M3 scales as one byte each, NVFP4's tensor scale), decoded into every storage
// dtype the backend declares, equal the reference's fp32 values rounded once into that dtype, bit
// for bit: partial blocks at both edges, a zero block, one element. Codes or scales of the wrong
// size, a 1-D out and a missing tensor scale are BackendErrors.
TEST_P(Conformance, BlockScaledWeightDequantizeIsTheSdkReferenceRoundedOnce) {
  MIXTRAIN_FACETS(quantized_weight, QuantizedWeightFacet);
  const sdk::QuantizedWeightOp op = sdk::QuantizedWeightOp::dequantize_block_scaled;
  const std::vector<sdk::BlockScaledLayout> layouts = {
      sdk::fp8_block_weight_layout(),
      sdk::fp8_block_weight_layout(sdk::BlockElement::e4m3, true),
      sdk::mx_layout(sdk::ReductionAxis::cols, sdk::BlockElement::e4m3),
      sdk::mx_layout(sdk::ReductionAxis::rows, sdk::BlockElement::e5m2),
      sdk::mx_layout(sdk::ReductionAxis::cols, sdk::BlockElement::e2m1),
      sdk::nvfp4_weight_layout()};
  auto bytes_on = [&](const std::vector<std::uint8_t>& v) {
    auto t = std::make_unique<DeviceTensor>(*tested_, DType::fp8_e4m3,
                                            Shape{static_cast<std::int64_t>(v.size())});
    tested_->copy_from_host(t->view(), v.data());
    return t;
  };
  for (const auto& layout : layouts)
    for (const Shape shape : {Shape{130, 70}, Shape{7, 37}, Shape{1, 1}}) {
      auto x = random_values(static_cast<std::size_t>(shape.numel()), 63, -3.0f, 3.0f);
      for (std::size_t i = 0; i < x.size() && i < 16; ++i) x[i] = 0.0f;  // a zero 1x16 block
      if (x.size() > 40) x[40] = 900.0f;                                 // an outlier
      const auto q = sdk::quantize_block_scaled(x, shape[0], shape[1], layout);
      const auto want = sdk::dequantize_block_scaled(q);
      const bool packed = layout.element == sdk::BlockElement::e2m1;
      const auto codes = bytes_on(packed ? sdk::pack_e2m1(q.codes) : q.codes);
      const sdk::BlockExtent grid = sdk::block_grid(layout, shape[0], shape[1]);
      std::unique_ptr<DeviceTensor> scales;
      if (q.scales.empty())
        scales = bytes_on(q.scale_codes);
      else
        scales = make_on(*tested_, q.scales, Shape{grid.rows * grid.cols}, DType::fp32, 1.0f);
      const auto tensor_scale =
          make_on(*tested_, std::vector<float>{q.tensor_scale}, Shape{1}, DType::fp32, 1.0f);
      sdk::BlockScaledWeight w{codes->view(), scales->view(), {}, layout};
      if (layout.tensor_scale) w.tensor_scale = tensor_scale->view();
      for (DType dt : kStorageFloats) {
        if (!tested_quantized_weight->supports(op, std::vector<DType>{dt})) continue;
        const auto expected = upload(want, shape, dt);
        DeviceTensor out(*tested_, dt, shape);
        tested_quantized_weight->dequantize_block_scaled(w, out.view());
        const auto got = download(*tested_, out.view());
        const auto ref = ref_values(expected);
        ASSERT_EQ(got.size(), ref.size());
        for (std::size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(ref[i]))
              << sdk::describe(layout) << " " << shape.to_string() << " " << sdk::dtype_name(dt)
              << " element " << i;
      }
    }
  if (!tested_quantized_weight->supports(op, std::vector<DType>{DType::fp32})) return;
  const auto layout = sdk::mx_layout(sdk::ReductionAxis::cols, sdk::BlockElement::e4m3);
  DeviceTensor codes(*tested_, DType::fp8_e4m3, Shape{64 * 64});
  DeviceTensor short_codes(*tested_, DType::fp8_e4m3, Shape{64 * 63});
  DeviceTensor scales(*tested_, DType::fp8_e4m3, Shape{64 * 2});
  DeviceTensor short_scales(*tested_, DType::fp8_e4m3, Shape{64});
  DeviceTensor out(*tested_, DType::fp32, Shape{64, 64});
  DeviceTensor flat(*tested_, DType::fp32, Shape{64 * 64});
  auto refuses = [&](const sdk::BlockScaledWeight& w, const sdk::TensorView& o) {
    EXPECT_THROW(tested_quantized_weight->dequantize_block_scaled(w, o), sdk::BackendError)
        << sdk::describe(w.layout) << " into " << o.shape.to_string();
  };
  refuses({short_codes.view(), scales.view(), {}, layout}, out.view());
  refuses({codes.view(), short_scales.view(), {}, layout}, out.view());
  refuses({codes.view(), scales.view(), {}, layout}, flat.view());
  // NVFP4 with its codes (packed) and 16x16 block scales right, but no tensor scale.
  DeviceTensor packed(*tested_, DType::fp8_e4m3, Shape{64 * 64 / 2});
  DeviceTensor block_scales(*tested_, DType::fp8_e4m3, Shape{4 * 4});
  refuses({packed.view(), block_scales.view(), {}, sdk::nvfp4_weight_layout()}, out.view());
}

// The scratch facet reports the part of memory_stats() the backend keeps for itself: with every
// tensor a caller allocated freed again, what stays counted beyond the caller's is that scratch,
// and it never exceeds the count. GEMMs in every declared input format (the emulated ones keep
// decoded copies on the CPU backend) and a 16-bit output give it something to keep.
TEST_P(Conformance, ScratchIsTheCountedMemoryNoCallerHolds) {
  MIXTRAIN_FACETS(scratch, ScratchFacet);
  auto* gemm = sdk::facet<sdk::GemmFacet>(*tested_);
  ASSERT_NE(gemm, nullptr);
  const auto before = tested_->memory_stats();
  const std::size_t scratch_before = tested_scratch->scratch_bytes();
  ASSERT_LE(scratch_before, before.current_bytes);
  const std::int64_t m = 96, n = 80, k = 72;
  for (const auto& support : tested_->capabilities().gemm_inputs) {
    const DType dt = support.dtype;
    if (dt == DType::int32 || dt == DType::tf32) continue;
    auto a =
        make_on(*tested_, random_values(static_cast<std::size_t>(m * k), 6), Shape{m, k}, dt, 1.0f);
    auto b =
        make_on(*tested_, random_values(static_cast<std::size_t>(k * n), 7), Shape{k, n}, dt, 1.0f);
    DeviceTensor c(*tested_, DType::fp16, Shape{m, n});
    sdk::GemmArgs g;
    g.a.view = a->view();
    g.b.view = b->view();
    g.c = c.view();
    gemm->gemm(g);
    tested_->synchronize();
    EXPECT_LE(tested_scratch->scratch_bytes(), tested_->memory_stats().current_bytes)
        << sdk::dtype_name(dt);
  }
  const auto after = tested_->memory_stats();
  const std::size_t scratch_after = tested_scratch->scratch_bytes();
  ASSERT_LE(scratch_after, after.current_bytes);
  EXPECT_EQ(after.current_bytes - scratch_after, before.current_bytes - scratch_before);
}

// The quickstart model trained for 100 steps on both backends: every step's loss agrees.
TEST_P(Conformance, TrainingParityOnQuickstart) {
  auto train = [&](const std::vector<std::string>& backend_sets) {
    auto config = core::Config::from_string(kEmbeddedQuickstartToml, "quickstart.toml", [&] {
      std::vector<std::string> sets = {"run.steps=100", "run.log_every=1", "run.eval_every=0",
                                       "checkpoint.every=0"};
      sets.insert(sets.end(), backend_sets.begin(), backend_sets.end());
      return sets;
    }());
    core::PluginRegistry registry(&core::host_log_sink());
    registry.scan(core::PluginRegistry::default_search_path());
    auto e = core::parse_experiment(config, registry);
    auto c = core::create_components(e, registry);
    auto dir = std::filesystem::temp_directory_path() /
               ("mixtrain-conformance-" + std::to_string(::getpid()) + "-" +
                std::to_string(backend_sets.size()));
    std::filesystem::remove_all(dir);
    core::TrainOptions opt;
    opt.run_dir = dir;
    core::Trainer(e, std::move(c), opt).run();
    std::vector<double> losses;
    std::ifstream metrics(dir / "metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
    }
    std::filesystem::remove_all(dir);
    return losses;
  };
  if (GetParam().config_overrides.empty())
    GTEST_SKIP() << "no config selects backend '" << GetParam().name << "'";
  auto want = train({"backend.type=cpu"});
  auto got = train(GetParam().config_overrides);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-3 * std::abs(want[i]) + 1e-5) << "step " << i + 1;
}

// --- convolution, pooling, batch norm and the image permutes against double references -------

// Normwise relative difference against a double-precision reference.
double relative_to(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Tolerance for a result rounded once into `out` after FP32 accumulation: the rounding's relative
// error (2^-8 bf16, 2^-11 fp16), or a few hundred FP32 ulps of accumulation for fp32.
double output_tolerance(DType out) {
  return out == DType::bf16 ? 0x1p-8 : (out == DType::fp16 ? 0x1p-10 : 2e-5);
}

std::vector<double> widen(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

std::vector<double> absolute(std::vector<double> v) {
  for (double& x : v) x = std::abs(x);
  return v;
}

// A tf32 result's normwise tolerance against the reference, which rounds each fp32 operand to
// tf32 to nearest. Hardware may truncate instead: one tf32 unit (2^-10 relative) per operand, so
// each product a·b moves by up to 2^-9·|a·b|, and the sum by 2^-9·Σ|a||b| (`abs_sums`, the same
// computation over absolute values), on top of the FP32 accumulation's `fp32_tol`.
double tf32_tolerance(const std::vector<double>& abs_sums, const std::vector<double>& want,
                      double fp32_tol) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += abs_sums[i] * abs_sums[i];
    den += want[i] * want[i];
  }
  return fp32_tol + (den == 0 ? 0.0 : 0x1p-9 * std::sqrt(num / den));
}

// The values an operand stands for: stored (decoded) × scale_inv, tf32-rounded when asked.
std::vector<double> real_operand(const std::vector<float>& stored_values, float scale_inv,
                                 bool tf32) {
  std::vector<double> r(stored_values.size());
  for (std::size_t i = 0; i < r.size(); ++i) {
    const float v = tf32 ? sdk::round_to_tf32(stored_values[i]) : stored_values[i];
    r[i] = static_cast<double>(v) * scale_inv;
  }
  return r;
}

sdk::Conv2dGeometry conv_geometry(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                                  std::int64_t o, std::int64_t kh, std::int64_t kw, std::int64_t sh,
                                  std::int64_t sw, std::int64_t ph, std::int64_t pw,
                                  std::int64_t dh, std::int64_t dw, std::int64_t groups) {
  sdk::Conv2dGeometry g;
  g.batch = n;
  g.in_channels = c;
  g.height = h;
  g.width = w;
  g.out_channels = o;
  g.kernel_h = kh;
  g.kernel_w = kw;
  g.stride_h = sh;
  g.stride_w = sw;
  g.pad_h = ph;
  g.pad_w = pw;
  g.dilation_h = dh;
  g.dilation_w = dw;
  g.groups = groups;
  return g;
}

// The three convolution products in double by direct loops over (image, output pixel, output
// channel, tap): y from x, w (and bias); dx from dy, w; dw and dbias from x, dy (pass empty
// vectors for what an op does not read). Channels-last
// x [N, H, W, C], y/dy [N, OH, OW, O]; w [O, C/g, KH, KW].
struct ConvReference {
  std::vector<double> y, dx, dw, dbias;
};
ConvReference naive_conv(const sdk::Conv2dGeometry& g, const std::vector<double>& x,
                         const std::vector<double>& w, const std::vector<double>& dy,
                         const std::vector<double>* bias) {
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width();
  const std::int64_t cpg = g.in_channels / g.groups, opg = g.out_channels / g.groups;
  ConvReference r;
  r.y.assign(static_cast<std::size_t>(g.batch * oh_n * ow_n * g.out_channels), 0.0);
  r.dx.assign(static_cast<std::size_t>(g.batch * g.height * g.width * g.in_channels), 0.0);
  r.dw.assign(static_cast<std::size_t>(g.out_channels * cpg * g.kernel_h * g.kernel_w), 0.0);
  r.dbias.assign(static_cast<std::size_t>(g.out_channels), 0.0);
  for (std::int64_t n = 0; n < g.batch; ++n)
    for (std::int64_t oh = 0; oh < oh_n; ++oh)
      for (std::int64_t ow = 0; ow < ow_n; ++ow)
        for (std::int64_t o = 0; o < g.out_channels; ++o) {
          const auto yi =
              static_cast<std::size_t>(((n * oh_n + oh) * ow_n + ow) * g.out_channels + o);
          double acc = bias != nullptr ? (*bias)[static_cast<std::size_t>(o)] : 0.0;
          const double d = dy.empty() ? 0.0 : dy[yi];
          for (std::int64_t ci = 0; ci < cpg; ++ci)
            for (std::int64_t kh = 0; kh < g.kernel_h; ++kh)
              for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
                const std::int64_t ih = oh * g.stride_h - g.pad_h + kh * g.dilation_h;
                const std::int64_t iw = ow * g.stride_w - g.pad_w + kw * g.dilation_w;
                if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
                const std::int64_t c = o / opg * cpg + ci;
                const auto xi = static_cast<std::size_t>(
                    ((n * g.height + ih) * g.width + iw) * g.in_channels + c);
                const auto wi =
                    static_cast<std::size_t>(((o * cpg + ci) * g.kernel_h + kh) * g.kernel_w + kw);
                if (!x.empty() && !w.empty()) acc += x[xi] * w[wi];
                if (!dy.empty() && !w.empty()) r.dx[xi] += d * w[wi];
                if (!dy.empty() && !x.empty()) r.dw[wi] += x[xi] * d;
              }
          r.y[yi] = acc;
          r.dbias[static_cast<std::size_t>(o)] += d;
        }
  return r;
}

TEST_P(Conformance, Conv2dEveryDtypeAndGeometryMatchesADoubleReference) {
  MIXTRAIN_FACETS(convolution, ConvolutionFacet);
  struct Geometry {
    const char* name;
    sdk::Conv2dGeometry g;
    bool bias;
  };
  const std::vector<Geometry> geometries = {
      {"3x3 pad 1", conv_geometry(2, 3, 7, 7, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1), true},
      {"ResNet-like 16->16", conv_geometry(4, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1), false},
      {"3x2 stride 2x1 dilation 1x2 groups 2",
       conv_geometry(2, 4, 9, 8, 6, 3, 2, 2, 1, 1, 0, 1, 2, 2), true},
      {"depthwise dilation 2", conv_geometry(3, 8, 6, 6, 8, 3, 3, 1, 1, 2, 2, 2, 2, 8), false},
      {"1x1 stride 2", conv_geometry(2, 16, 8, 8, 8, 1, 1, 2, 2, 0, 0, 1, 1, 1), true},
      // Fewer input channels than a SIMD block (8 with AVX2, 16 with AVX-512): oneDNN 2.6's 1x1
      // weight-gradient kernels overran their buffers here (cpu_conv_primitives.cpp).
      {"1x1 stride 2, 4 -> 8 channels", conv_geometry(4, 4, 16, 16, 8, 1, 1, 2, 2, 0, 0, 1, 1, 1),
       false},
      {"1x1 stride 2, 12 -> 16 channels",
       conv_geometry(4, 12, 16, 16, 16, 1, 1, 2, 2, 0, 0, 1, 1, 1), true},
      {"floor: 7x6 stride 2 no pad", conv_geometry(2, 5, 7, 6, 3, 3, 3, 2, 2, 0, 0, 1, 1, 1),
       false},
  };
  struct Route {
    DType a, b, out, compute;
    float scale_a, scale_b;  // cast scales: stored = real * scale, scale_inv = 1 / scale (fp8)
  };
  const std::vector<Route> routes = {
      {DType::fp32, DType::fp32, DType::fp32, DType::fp32, 1, 1},
      {DType::fp32, DType::fp32, DType::bf16, DType::fp32, 1, 1},
      {DType::fp32, DType::fp32, DType::fp16, DType::fp32, 1, 1},
      {DType::fp32, DType::fp32, DType::fp32, DType::tf32, 1, 1},
      {DType::bf16, DType::bf16, DType::fp32, DType::fp32, 1, 1},
      {DType::bf16, DType::bf16, DType::bf16, DType::fp32, 1, 1},
      {DType::fp16, DType::fp16, DType::fp16, DType::fp32, 1, 1},
      {DType::fp16, DType::fp16, DType::fp32, DType::fp32, 1, 1},
      {DType::fp8_e4m3, DType::fp8_e4m3, DType::fp32, DType::fp32, 4, 3},
      {DType::fp8_e5m2, DType::fp8_e4m3, DType::bf16, DType::fp32, 8, 2},
      {DType::bf16, DType::fp32, DType::fp16, DType::fp32, 1, 1},
  };
  using C = sdk::ConvolutionOp;
  for (C op : {C::conv2d_forward, C::conv2d_backward_data})
    if (!tested_convolution->supports(op, std::vector<DType>(3, DType::fp32)))
      ADD_FAILURE() << "the convolution facet must support " << sdk::op_name(op) << " in fp32";
  for (const Geometry& geo : geometries)
    for (const Route& rt : routes) {
      const auto& g = geo.g;
      const Shape xs{g.batch, g.height, g.width, g.in_channels};
      const Shape ys{g.batch, g.out_height(), g.out_width(), g.out_channels};
      const Shape ws{g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
      const bool tf32 = rt.compute == DType::tf32;
      const float inv_a = sdk::is_fp8(rt.a) ? 1.0f / rt.scale_a : 1.0f;
      const float inv_b = sdk::is_fp8(rt.b) ? 1.0f / rt.scale_b : 1.0f;
      const double tol = output_tolerance(rt.out);
      const std::string what = std::string(geo.name) + ", " + dtypes_text({rt.a, rt.b, rt.out}) +
                               (tf32 ? " compute tf32" : "");
      const auto xv = random_values(static_cast<std::size_t>(xs.numel()), 60);
      const auto wv = random_values(static_cast<std::size_t>(ws.numel()), 61);
      const auto dyv = random_values(static_cast<std::size_t>(ys.numel()), 62);
      const auto bv = random_values(static_cast<std::size_t>(g.out_channels), 63);
      auto bias = upload(bv, Shape{g.out_channels});
      const std::vector<double> bias_real = widen(bv);
      auto side = [&](int which, const Pair& p) {
        return which == 0 ? p.ref->view() : p.tested->view();
      };
      auto facet = [&](int which) { return which == 0 ? ref_convolution : tested_convolution; };

      if (tested_convolution->supports(C::conv2d_forward, std::vector<DType>{rt.a, rt.b, rt.out})) {
        auto x = upload(xv, xs, rt.a, rt.scale_a);
        auto w = upload(wv, ws, rt.b, rt.scale_b);
        auto y = zeros(ys, rt.out);
        for (int which : {0, 1}) {
          sdk::Conv2dForwardArgs f;
          f.geometry = g;
          f.x = {side(which, x), false, inv_a};
          f.w = {side(which, w), false, inv_b};
          if (geo.bias) f.bias = side(which, bias);
          f.y = side(which, y);
          f.compute = rt.compute;
          facet(which)->conv2d_forward(f);
        }
        const auto xr = real_operand(tested_values(x), inv_a, tf32);
        const auto wr = real_operand(tested_values(w), inv_b, tf32);
        const auto want = naive_conv(g, xr, wr, {}, geo.bias ? &bias_real : nullptr);
        const std::vector<double> bias_abs = absolute(bias_real);
        const double y_tol = tf32 ? tf32_tolerance(naive_conv(g, absolute(xr), absolute(wr), {},
                                                              geo.bias ? &bias_abs : nullptr)
                                                       .y,
                                                   want.y, tol)
                                  : tol;
        EXPECT_LE(relative_to(tested_values(y), want.y), y_tol) << "conv2d_forward " << what;
        expect_close(y, y_tol, "conv2d_forward vs the reference backend, " + what);
      }
      if (tested_convolution->supports(C::conv2d_backward_data,
                                       std::vector<DType>{rt.a, rt.b, rt.out})) {
        auto dy = upload(dyv, ys, rt.a, rt.scale_a);
        auto w = upload(wv, ws, rt.b, rt.scale_b);
        auto dx = zeros(xs, rt.out);
        for (int which : {0, 1}) {
          sdk::Conv2dBackwardDataArgs b;
          b.geometry = g;
          b.dy = {side(which, dy), false, inv_a};
          b.w = {side(which, w), false, inv_b};
          b.dx = side(which, dx);
          b.compute = rt.compute;
          facet(which)->conv2d_backward_data(b);
        }
        const auto wr = real_operand(tested_values(w), inv_b, tf32);
        const auto dyr = real_operand(tested_values(dy), inv_a, tf32);
        const auto want = naive_conv(g, {}, wr, dyr, nullptr);
        const double dx_tol =
            tf32 ? tf32_tolerance(naive_conv(g, {}, absolute(wr), absolute(dyr), nullptr).dx,
                                  want.dx, tol)
                 : tol;
        EXPECT_LE(relative_to(tested_values(dx), want.dx), dx_tol)
            << "conv2d_backward_data " << what;
        expect_close(dx, dx_tol, "conv2d_backward_data vs the reference backend, " + what);
      }
      if (tested_convolution->supports(C::conv2d_backward_weights,
                                       std::vector<DType>{rt.a, rt.b})) {
        auto x = upload(xv, xs, rt.a, rt.scale_a);
        auto dy = upload(dyv, ys, rt.b, rt.scale_b);
        const auto xr = real_operand(tested_values(x), inv_a, tf32);
        const auto dyr = real_operand(tested_values(dy), inv_b, tf32);
        const auto want = naive_conv(g, xr, {}, dyr, nullptr);
        // dw and dbias are fp32: FP32 accumulation over N·OH·OW products (and tf32's operands).
        const auto abs_want = naive_conv(g, absolute(xr), {}, absolute(dyr), nullptr);
        // dbias = Σ dy: its real values are dy's.
        for (bool accumulate : {false, true}) {
          const auto dw0 = random_values(static_cast<std::size_t>(ws.numel()), 64);
          const auto db0 = random_values(static_cast<std::size_t>(g.out_channels), 65);
          auto dw = upload(dw0, ws);
          auto db = upload(db0, Shape{g.out_channels});
          for (int which : {0, 1}) {
            sdk::Conv2dBackwardWeightsArgs b;
            b.geometry = g;
            b.x = {side(which, x), false, inv_a};
            b.dy = {side(which, dy), false, inv_b};
            b.dw = side(which, dw);
            if (geo.bias) b.dbias = side(which, db);
            b.accumulate = accumulate;
            b.compute = rt.compute;
            facet(which)->conv2d_backward_weights(b);
          }
          std::vector<double> want_dw = want.dw, want_db = want.dbias;
          for (std::size_t i = 0; i < want_dw.size(); ++i) want_dw[i] += accumulate ? dw0[i] : 0.0;
          for (std::size_t i = 0; i < want_db.size(); ++i)
            want_db[i] = geo.bias ? want_db[i] + (accumulate ? db0[i] : 0.0) : db0[i];
          const std::string w_what = what + (accumulate ? ", accumulate" : "");
          double dw_tol = 2e-5, db_tol = 2e-5;
          if (tf32) {
            std::vector<double> abs_dw = abs_want.dw, abs_db = abs_want.dbias;
            for (std::size_t i = 0; i < abs_dw.size(); ++i)
              abs_dw[i] += accumulate ? std::abs(dw0[i]) : 0.0;
            for (std::size_t i = 0; i < abs_db.size(); ++i)
              abs_db[i] =
                  geo.bias ? abs_db[i] + (accumulate ? std::abs(db0[i]) : 0.0) : std::abs(db0[i]);
            dw_tol = tf32_tolerance(abs_dw, want_dw, dw_tol);
            db_tol = tf32_tolerance(abs_db, want_db, db_tol);
          }
          EXPECT_LE(relative_to(tested_values(dw), want_dw), dw_tol)
              << "conv2d_backward_weights dw " << w_what;
          EXPECT_LE(relative_to(tested_values(db), want_db), db_tol)
              << "conv2d_backward_weights dbias " << w_what;
          expect_close(dw, dw_tol,
                       "conv2d_backward_weights dw vs the reference backend, " + w_what);
          expect_close(db, db_tol,
                       "conv2d_backward_weights dbias vs the reference backend, " + w_what);
        }
      }
    }
}

// convolution 1.1: the accumulating data gradient adds into an fp32 dx what conv2d_backward_data
// computes, in FP32: against old dx + the double reference, and against the reference backend's
// implementation (the CPU implements it whether or not it offers it). The contract lets 16-bit
// operands' gradient be rounded once into their dtype before the add where a library cannot add
// it unrounded, so their tolerance has that rounding of the gradient on top; fp32 operands' has
// FP32 accumulation only. Per operand route a backend offers, including the geometries with
// padding, strides, dilation and groups; then the bad arguments.
TEST_P(Conformance, Conv2dBackwardDataAccumulateAddsTheGradientIntoAnFp32Sum) {
  MIXTRAIN_FACETS(convolution, ConvolutionFacet);
  using C = sdk::ConvolutionOp;
  if (tested_convolution->version() < sdk::FacetVersion{1, 1})
    GTEST_SKIP() << "backend '" << GetParam().name << "' has convolution facet "
                 << sdk::to_string(tested_convolution->version());
  struct Route {
    DType a, b, compute;
  };
  const std::vector<Route> routes = {{DType::fp32, DType::fp32, DType::fp32},
                                     {DType::fp32, DType::fp32, DType::tf32},
                                     {DType::bf16, DType::bf16, DType::fp32},
                                     {DType::fp16, DType::fp16, DType::fp32}};
  const std::vector<sdk::Conv2dGeometry> geometries = {
      conv_geometry(2, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1),
      conv_geometry(2, 4, 9, 8, 6, 3, 2, 2, 1, 1, 0, 1, 2, 2),
      conv_geometry(2, 16, 8, 8, 8, 1, 1, 2, 2, 0, 0, 1, 1, 1)};
  int offered = 0;
  for (const Route& rt : routes) {
    if (!tested_convolution->supports(C::conv2d_backward_data_accumulate,
                                      std::vector<DType>{rt.a, rt.b, DType::fp32}))
      continue;
    ++offered;
    const bool tf32 = rt.compute == DType::tf32;
    for (const auto& g : geometries) {
      const Shape xs{g.batch, g.height, g.width, g.in_channels};
      const Shape ys{g.batch, g.out_height(), g.out_width(), g.out_channels};
      const Shape ws{g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
      const std::string what =
          dtypes_text({rt.a, rt.b, DType::fp32}) + (tf32 ? " compute tf32" : "") + ", " +
          std::to_string(g.in_channels) + " -> " + std::to_string(g.out_channels) + " channels";
      auto dy = upload(random_values(static_cast<std::size_t>(ys.numel()), 70), ys, rt.a);
      auto w = upload(random_values(static_cast<std::size_t>(ws.numel()), 71), ws, rt.b);
      const auto dx0 = random_values(static_cast<std::size_t>(xs.numel()), 72);
      auto dx = upload(dx0, xs);  // the other reader's contribution, already in the sum
      for (int which : {0, 1}) {
        sdk::Conv2dBackwardDataArgs b;
        b.geometry = g;
        b.dy.view = which == 0 ? dy.ref->view() : dy.tested->view();
        b.w.view = which == 0 ? w.ref->view() : w.tested->view();
        b.dx = which == 0 ? dx.ref->view() : dx.tested->view();
        b.compute = rt.compute;
        (which == 0 ? ref_convolution : tested_convolution)->conv2d_backward_data_accumulate(b);
      }
      const auto wr = real_operand(tested_values(w), 1.0f, tf32);
      const auto dyr = real_operand(tested_values(dy), 1.0f, tf32);
      const std::vector<double> gradient = naive_conv(g, {}, wr, dyr, nullptr).dx;
      std::vector<double> want = gradient;
      std::vector<double> abs_sums = naive_conv(g, {}, absolute(wr), absolute(dyr), nullptr).dx;
      for (std::size_t i = 0; i < want.size(); ++i) {
        want[i] += dx0[i];
        abs_sums[i] += std::abs(dx0[i]);
      }
      // FP32 accumulation and one FP32 addition, plus for 16-bit operands at most one rounding of
      // the gradient into their dtype (2^-9 bf16, 2^-12 fp16 of each element, normwise relative
      // to the sum).
      double tol = tf32 ? tf32_tolerance(abs_sums, want, 2e-5) : 2e-5;
      if (rt.a != DType::fp32) {
        double g2 = 0, w2 = 0;
        for (std::size_t i = 0; i < want.size(); ++i) {
          g2 += gradient[i] * gradient[i];
          w2 += want[i] * want[i];
        }
        tol += (rt.a == DType::bf16 ? 0x1p-9 : 0x1p-12) * std::sqrt(g2 / w2);
      }
      EXPECT_LE(relative_to(tested_values(dx), want), tol) << what;
      expect_close(dx, tol, "conv2d_backward_data_accumulate vs the reference backend, " + what);
    }
  }
  if (offered == 0)
    GTEST_SKIP() << "backend '" << GetParam().name << "' offers no conv2d_backward_data_accumulate";
  EXPECT_FALSE(
      tested_convolution->supports(C::conv2d_backward_data_accumulate,
                                   std::vector<DType>{DType::bf16, DType::bf16, DType::bf16}))
      << "a 16-bit dx is not a sum to add into";
  // dx must be fp32 and apart from dy and w.
  const auto g = geometries[0];
  const Shape xs{g.batch, g.height, g.width, g.in_channels};
  const Shape ys{g.batch, g.out_height(), g.out_width(), g.out_channels};
  const Shape ws{g.out_channels, g.in_channels, g.kernel_h, g.kernel_w};
  auto dy = upload(random_values(static_cast<std::size_t>(ys.numel()), 73), ys);
  auto w = upload(random_values(static_cast<std::size_t>(ws.numel()), 74), ws);
  auto dx16 = zeros(xs, DType::bf16);
  sdk::Conv2dBackwardDataArgs b;
  b.geometry = g;
  b.dy.view = dy.tested->view();
  b.w.view = w.tested->view();
  b.dx = dx16.tested->view();
  EXPECT_THROW(tested_convolution->conv2d_backward_data_accumulate(b), sdk::BackendError)
      << "a bf16 dx";
  b.dx = {dy.tested->view().data, DType::fp32, xs};  // ys and xs hold as many elements here
  EXPECT_THROW(tested_convolution->conv2d_backward_data_accumulate(b), sdk::BackendError)
      << "dx on dy";
}

// A workspace of at least `bytes` (int32 elements) on one backend.
std::unique_ptr<DeviceTensor> workspace_on(sdk::DeviceBackend& b, std::size_t bytes) {
  return std::make_unique<DeviceTensor>(
      b, DType::int32,
      Shape{std::max<std::int64_t>(1, static_cast<std::int64_t>((bytes + 3) / 4))});
}

// Pooling in double: y, and dx for dy (max: dy to the first maximum in row-major window order).
struct PoolReference {
  std::vector<double> y, dx;
};
PoolReference naive_pool(const sdk::Pool2dGeometry& g, const std::vector<double>& x,
                         const std::vector<double>& dy) {
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width();
  PoolReference r;
  r.y.assign(static_cast<std::size_t>(g.batch * oh_n * ow_n * g.channels), 0.0);
  r.dx.assign(x.size(), 0.0);
  for (std::int64_t n = 0; n < g.batch; ++n)
    for (std::int64_t oh = 0; oh < oh_n; ++oh)
      for (std::int64_t ow = 0; ow < ow_n; ++ow)
        for (std::int64_t c = 0; c < g.channels; ++c) {
          const auto yi = static_cast<std::size_t>(((n * oh_n + oh) * ow_n + ow) * g.channels + c);
          double best = -std::numeric_limits<double>::infinity(), sum = 0.0;
          std::int64_t best_at = -1, count = 0;
          std::vector<std::size_t> inside;
          for (std::int64_t kh = 0; kh < g.kernel_h; ++kh)
            for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
              const std::int64_t ih = oh * g.stride_h - g.pad_h + kh;
              const std::int64_t iw = ow * g.stride_w - g.pad_w + kw;
              if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
              const auto xi =
                  static_cast<std::size_t>(((n * g.height + ih) * g.width + iw) * g.channels + c);
              inside.push_back(xi);
              sum += x[xi];
              ++count;
              if (x[xi] > best) {
                best = x[xi];
                best_at = static_cast<std::int64_t>(xi);
              }
            }
          if (g.kind == sdk::PoolKind::max) {
            r.y[yi] = best;
            r.dx[static_cast<std::size_t>(best_at)] += dy[yi];
          } else {
            const double div = g.count_include_pad ? static_cast<double>(g.kernel_h * g.kernel_w)
                                                   : static_cast<double>(count);
            r.y[yi] = sum / div;
            for (std::size_t xi : inside) r.dx[xi] += dy[yi] / div;
          }
        }
  return r;
}

sdk::Pool2dGeometry pool_geometry(sdk::PoolKind kind, bool include_pad, std::int64_t n,
                                  std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t kh,
                                  std::int64_t kw, std::int64_t sh, std::int64_t sw,
                                  std::int64_t ph, std::int64_t pw) {
  sdk::Pool2dGeometry g;
  g.kind = kind;
  g.count_include_pad = include_pad;
  g.batch = n;
  g.channels = c;
  g.height = h;
  g.width = w;
  g.kernel_h = kh;
  g.kernel_w = kw;
  g.stride_h = sh;
  g.stride_w = sw;
  g.pad_h = ph;
  g.pad_w = pw;
  return g;
}

TEST_P(Conformance, PoolingMaxAndAverageForwardBackwardMatchADoubleReference) {
  MIXTRAIN_FACETS(convolution, ConvolutionFacet);
  using K = sdk::PoolKind;
  struct Case {
    const char* name;
    sdk::Pool2dGeometry g;
  };
  const std::vector<Case> cases = {
      {"max 3x3 stride 2 pad 1", pool_geometry(K::max, true, 2, 5, 7, 7, 3, 3, 2, 2, 1, 1)},
      {"max 2x2 stride 2", pool_geometry(K::max, true, 2, 16, 8, 8, 2, 2, 2, 2, 0, 0)},
      {"max 3x2 stride 1x2 pad 1x1", pool_geometry(K::max, true, 2, 3, 6, 7, 3, 2, 1, 2, 1, 1)},
      {"avg 3x3 stride 2 pad 1 include pad",
       pool_geometry(K::average, true, 2, 5, 7, 7, 3, 3, 2, 2, 1, 1)},
      {"avg 3x3 stride 2 pad 1 exclude pad",
       pool_geometry(K::average, false, 2, 5, 7, 7, 3, 3, 2, 2, 1, 1)},
      {"avg 2x3 stride 1 pad 1x1 exclude pad",
       pool_geometry(K::average, false, 2, 4, 5, 6, 2, 3, 1, 1, 1, 1)},
      {"global average 8x8", pool_geometry(K::average, true, 3, 10, 8, 8, 8, 8, 1, 1, 0, 0)},
  };
  using C = sdk::ConvolutionOp;
  for (C op : {C::pool2d_forward, C::pool2d_backward})
    if (!tested_convolution->supports(op, std::vector<DType>(2, DType::fp32)))
      ADD_FAILURE() << "the convolution facet must support " << sdk::op_name(op) << " in fp32";
  for (const Case& pc : cases)
    for (DType dt : kStorageFloats) {
      const std::vector<DType> pair{dt, dt};
      if (!tested_convolution->supports(C::pool2d_forward, pair) ||
          !tested_convolution->supports(C::pool2d_backward, pair))
        continue;
      const auto& g = pc.g;
      const bool max = g.kind == K::max;
      const Shape xs{g.batch, g.height, g.width, g.channels};
      const Shape ys{g.batch, g.out_height(), g.out_width(), g.channels};
      const std::string what = std::string(pc.name) + ", " + std::string(sdk::dtype_name(dt));
      auto x = upload(random_values(static_cast<std::size_t>(xs.numel()), 70, -2.f, 2.f), xs, dt);
      auto dy = upload(random_values(static_cast<std::size_t>(ys.numel()), 71), ys, dt);
      const auto want = naive_pool(g, widen(tested_values(x)), widen(tested_values(dy)));
      // Max selects a stored value (exact); average and the summed gradients round once.
      const double tol = output_tolerance(dt);
      std::unique_ptr<DeviceTensor> ws_ref, ws_tested;
      if (max) {
        ws_ref = workspace_on(*ref_, ref_convolution->pool2d_workspace_bytes(g, dt));
        ws_tested = workspace_on(*tested_, tested_convolution->pool2d_workspace_bytes(g, dt));
      } else {
        EXPECT_EQ(tested_convolution->pool2d_workspace_bytes(g, dt), 0u) << what;
      }
      for (bool training : {true, false}) {
        if (!max && !training) continue;
        auto y = zeros(ys, dt);
        ref_convolution->pool2d_forward(g, x.ref->view(), y.ref->view(),
                                        max && training ? ws_ref->view() : TensorView{});
        tested_convolution->pool2d_forward(g, x.tested->view(), y.tested->view(),
                                           max && training ? ws_tested->view() : TensorView{});
        const std::string fwhat = what + (max ? (training ? ", workspace" : ", no workspace") : "");
        EXPECT_LE(relative_to(tested_values(y), want.y), max ? 0.0 : tol)
            << "pool2d_forward " << fwhat;
        expect_close(y, max ? 0.0 : tol, "pool2d_forward vs the reference backend, " + fwhat);
        if (!training) continue;
        // Backward from the workspace, and (max) from x alone.
        for (bool from_ws : {true, false}) {
          if (!max && !from_ws) continue;
          auto dx = upload(std::vector<float>(static_cast<std::size_t>(xs.numel()), 7.f), xs, dt);
          const TensorView wr = max && from_ws ? ws_ref->view() : TensorView{};
          const TensorView wt = max && from_ws ? ws_tested->view() : TensorView{};
          ref_convolution->pool2d_backward(g, dy.ref->view(), x.ref->view(), y.ref->view(), wr,
                                           dx.ref->view());
          tested_convolution->pool2d_backward(g, dy.tested->view(), x.tested->view(),
                                              y.tested->view(), wt, dx.tested->view());
          const std::string bwhat = what + (max ? (from_ws ? ", workspace" : ", from x") : "");
          EXPECT_LE(relative_to(tested_values(dx), want.dx), tol) << "pool2d_backward " << bwhat;
          expect_close(dx, tol, "pool2d_backward vs the reference backend, " + bwhat);
        }
      }
    }
}

TEST_P(Conformance, PoolingMaxTiesGoToTheFirstMaximumInTheWindow) {
  MIXTRAIN_FACETS(convolution, ConvolutionFacet);
  // Inputs from {0, 1, 2}: most windows hold several maxima. PyTorch routes dy to the first one in
  // row-major window order; so must every backend (exactly: dy are multiples of 1/8).
  const auto g = pool_geometry(sdk::PoolKind::max, true, 2, 6, 7, 7, 3, 3, 2, 2, 1, 1);
  const Shape xs{g.batch, g.height, g.width, g.channels};
  const Shape ys{g.batch, g.out_height(), g.out_width(), g.channels};
  std::mt19937 rng(72);
  std::vector<float> xv(static_cast<std::size_t>(xs.numel())),
      dyv(static_cast<std::size_t>(ys.numel()));
  for (auto& v : xv) v = static_cast<float>(rng() % 3);
  for (auto& v : dyv) v = static_cast<float>(static_cast<int>(rng() % 17) - 8) / 8.0f;
  for (DType dt : kStorageFloats) {
    if (!tested_convolution->supports(sdk::ConvolutionOp::pool2d_backward,
                                      std::vector<DType>{dt, dt}))
      continue;
    auto x = upload(xv, xs, dt);
    auto dy = upload(dyv, ys, dt);
    auto y = zeros(ys, dt);
    auto dx = zeros(xs, dt);
    auto ws = workspace_on(*tested_, tested_convolution->pool2d_workspace_bytes(g, dt));
    tested_convolution->pool2d_forward(g, x.tested->view(), y.tested->view(), ws->view());
    tested_convolution->pool2d_backward(g, dy.tested->view(), x.tested->view(), y.tested->view(),
                                        ws->view(), dx.tested->view());
    const auto want = naive_pool(g, widen(xv), widen(dyv));
    const auto got = tested_values(dx);
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], want.dx[i]) << sdk::dtype_name(dt) << " element " << i;
  }
}

// PyTorch's max_pool2d on special values (torch 1.13 checked: [NaN, 1] -> NaN, [-inf, -inf] ->
// -inf): a window holding a NaN gives NaN and an all -inf window gives -inf, with or without a
// workspace, in every storage dtype. oneDNN alone gives -3.4e38 for both and drops a NaN beside
// finite values, so this fails on a CPU backend that passes oneDNN's output through. 19 channels:
// oneDNN's vector body and its tail both run.
TEST_P(Conformance, PoolingMaxPropagatesNanAndKeepsMinusInfinityAsPyTorch) {
  MIXTRAIN_FACETS(convolution, ConvolutionFacet);
  const auto g = pool_geometry(sdk::PoolKind::max, true, 2, 19, 7, 7, 3, 3, 2, 2, 1, 1);
  const Shape xs{g.batch, g.height, g.width, g.channels};
  const Shape ys{g.batch, g.out_height(), g.out_width(), g.channels};
  auto xv = random_values(static_cast<std::size_t>(xs.numel()), 73, -2.f, 2.f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float minus_inf = -std::numeric_limits<float>::infinity();
  const auto at = [&](std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c) -> float& {
    return xv[static_cast<std::size_t>(((n * g.height + h) * g.width + w) * g.channels + c)];
  };
  at(0, 0, 0, 0) = nan;                 // a window's first element (padding aside)
  at(0, 3, 4, 7) = nan;                 // the middle of windows, beside finite values
  at(1, 6, 6, 18) = nan;                // the last channel, the image's corner
  for (std::int64_t h = 0; h < 2; ++h)  // the top-left window of channel 3 is all -inf
    for (std::int64_t w = 0; w < 2; ++w) at(1, h, w, 3) = minus_inf;
  at(0, 5, 5, 11) = minus_inf;  // one -inf among finite values changes nothing
  for (std::int64_t c = 0; c < g.channels; ++c) at(0, 2, 2, c) = nan;  // a NaN in every channel
  // The rule in double, from the values as stored in each dtype.
  const auto want = [&](const std::vector<float>& x) {
    std::vector<double> y(static_cast<std::size_t>(ys.numel()));
    for (std::int64_t n = 0; n < g.batch; ++n)
      for (std::int64_t oh = 0; oh < g.out_height(); ++oh)
        for (std::int64_t ow = 0; ow < g.out_width(); ++ow)
          for (std::int64_t c = 0; c < g.channels; ++c) {
            double best = -std::numeric_limits<double>::infinity();
            for (std::int64_t kh = 0; kh < g.kernel_h; ++kh)
              for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
                const std::int64_t ih = oh * g.stride_h - g.pad_h + kh;
                const std::int64_t iw = ow * g.stride_w - g.pad_w + kw;
                if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
                const double v = x[static_cast<std::size_t>(
                    ((n * g.height + ih) * g.width + iw) * g.channels + c)];
                if (std::isnan(v) || v > best) best = v;
                if (std::isnan(best)) break;
              }
            y[static_cast<std::size_t>(
                ((n * g.out_height() + oh) * g.out_width() + ow) * g.channels + c)] = best;
          }
    return y;
  };
  for (DType dt : kStorageFloats) {
    if (!tested_convolution->supports(sdk::ConvolutionOp::pool2d_forward,
                                      std::vector<DType>{dt, dt}))
      continue;
    // upload() saturates 16-bit casts (-inf would arrive as the lowest finite value): cast here.
    DeviceTensor x32(*tested_, DType::fp32, xs);
    tested_->copy_from_host(x32.view(), xv.data());
    DeviceTensor x(*tested_, dt, xs);
    if (dt == DType::fp32)
      tested_->copy_from_host(x.view(), xv.data());
    else
      tested_->cast(x32.view(), x.view(), sdk::CastArgs{});
    const auto expected = want(download(*tested_, x.view()));
    std::size_t nans = 0, minus_infs = 0;
    for (double v : expected) {
      nans += std::isnan(v) ? 1 : 0;
      minus_infs += v == -std::numeric_limits<double>::infinity() ? 1 : 0;
    }
    ASSERT_GE(nans, 20u) << "the case must hold NaN windows";
    ASSERT_EQ(minus_infs, 1u) << "the case must hold one all -inf window, " << sdk::dtype_name(dt);
    auto ws = workspace_on(*tested_, tested_convolution->pool2d_workspace_bytes(g, dt));
    for (bool training : {true, false}) {
      auto y = zeros(ys, dt);
      tested_convolution->pool2d_forward(g, x.view(), y.tested->view(),
                                         training ? ws->view() : TensorView{});
      const auto got = tested_values(y);
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(expected[i]))
          ASSERT_TRUE(std::isnan(got[i]))
              << sdk::dtype_name(dt) << (training ? ", workspace" : ", no workspace") << ": output "
              << i << " is " << got[i] << ", its window holds a NaN";
        else
          ASSERT_EQ(static_cast<double>(got[i]), expected[i])
              << sdk::dtype_name(dt) << (training ? ", workspace" : ", no workspace") << ": output "
              << i;
      }
    }
  }
}

// Batch norm in double over [rows, C]: the batch statistics, y, and the training backward.
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
        std::vector<double> want_rm(rm0.size()), want_rv(rv0.size());
        for (std::size_t j = 0; j < want_rm.size(); ++j) {
          want_rm[j] = (1.0 - momentum) * rm0[j] + double{momentum} * want.mean[j];
          want_rv[j] = (1.0 - momentum) * rv0[j] +
                       double{momentum} * want.var[j] * static_cast<double>(rows) / (rows - 1.0);
        }
        EXPECT_LE(relative_to(tested_values(rm), want_rm), 1e-6) << "running_mean, " << what;
        EXPECT_LE(relative_to(tested_values(rv), want_rv), 1e-6) << "running_var, " << what;
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
          std::vector<double> want_rm(rm0.size()), want_rv(rv0.size());
          for (std::size_t j = 0; j < want_rm.size(); ++j) {
            want_rm[j] = (1.0 - momentum) * rm0[j] + double{momentum} * bn.mean[j];
            want_rv[j] = (1.0 - momentum) * rv0[j] +
                         double{momentum} * bn.var[j] * static_cast<double>(rows) / (rows - 1.0);
          }
          EXPECT_LE(relative_to(tested_values(rm), want_rm), 1e-6) << "running_mean, " << what;
          EXPECT_LE(relative_to(tested_values(rv), want_rv), 1e-6) << "running_var, " << what;
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

TEST_P(Conformance, ImagePermutesEveryDtypePair) {
  MIXTRAIN_FACETS(convolution, ConvolutionFacet);
  using C = sdk::ConvolutionOp;
  if (!tested_convolution->supports(C::to_channels_last, std::vector<DType>(2, DType::fp32)))
    ADD_FAILURE() << "the convolution facet must support to_channels_last in fp32";
  // Odd sizes, one image wider than a 32x32 tile in both directions, and RGB images (a side of
  // 3, which the CUDA backend moves a line per thread instead of by tiles).
  for (const auto& [n, ch, h, w] :
       {std::array<std::int64_t, 4>{2, 5, 3, 7}, std::array<std::int64_t, 4>{1, 40, 9, 9},
        std::array<std::int64_t, 4>{2, 3, 33, 35}}) {
    const Shape first{n, ch, h, w}, last{n, h, w, ch};
    const auto values = random_values(static_cast<std::size_t>(first.numel()), 90, -3.f, 3.f);
    for (DType st : kStorageFloats)
      for (DType dt : kStorageFloats) {
        const std::vector<DType> pair{st, dt};
        if (!tested_convolution->supports(C::to_channels_last, pair) ||
            !tested_convolution->supports(C::to_channels_first, std::vector<DType>{dt, st}))
          continue;
        const std::string what = dtypes_text({st, dt}) + " " + first.to_string();
        auto x = upload(values, first, st);
        auto y = zeros(last, dt);
        tested_convolution->to_channels_last(x.tested->view(), ch, h, w, y.tested->view());
        auto back = zeros(first, st);
        tested_convolution->to_channels_first(y.tested->view(), ch, h, w, back.tested->view());
        std::vector<float> want_y(values.size()), want_back(values.size());
        for (std::int64_t i = 0; i < n; ++i)
          for (std::int64_t c = 0; c < ch; ++c)
            for (std::int64_t p = 0; p < h * w; ++p) {
              const auto fi = static_cast<std::size_t>((i * ch + c) * h * w + p);
              const auto li = static_cast<std::size_t>((i * h * w + p) * ch + c);
              want_y[li] = stored(stored(values[fi], st), dt);
              want_back[fi] = stored(want_y[li], st);
            }
        EXPECT_EQ(tested_values(y), want_y) << "to_channels_last " << what;
        EXPECT_EQ(tested_values(back), want_back) << "to_channels_first " << what;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(conformance, Conformance, ::testing::ValuesIn(registered_backends()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace mixtrain::conformance
