// Fused unscale + finite check, sum of squares, first non-finite, and the fused SGD / AdamW
// updates against values computed by hand (PyTorch semantics as stated in device_backend.h).
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backend_test_util.h"
#include "isa_variants.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/gradient_clipping.h"

namespace mixtrain::backend_cpu::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(backend_cpu_mixed_precision, UnscaleAndCheckFiniteScalesEverythingAndFindsLastTensorInf) {
  CpuBackend be(2);
  const auto a0 = random_values(1000, 1);
  const auto b0 = random_values(70000, 2);  // spans several work pieces
  DeviceTensor a(be, DType::fp32, {10, 100}, a0);
  DeviceTensor b(be, DType::fp32, {70000}, b0);
  std::vector<float> c0(7, 3.0f);
  DeviceTensor c(be, DType::fp32, {7}, c0);
  std::vector<TensorView> grads = {a, b, c};
  EXPECT_FALSE(sdk::facet<sdk::GradientCheckFacet>(be)->unscale_and_check_finite(grads, 0.25f));
  EXPECT_EQ(a.get()[999], a0[999] * 0.25f);
  EXPECT_EQ(b.get()[69999], b0[69999] * 0.25f);
  EXPECT_EQ(c.get()[6], 0.75f);

  c0[6] = kInf;
  c.set(c0);
  EXPECT_TRUE(sdk::facet<sdk::GradientCheckFacet>(be)->unscale_and_check_finite(grads, 0.5f));
  c0[6] = kNaN;
  c.set(c0);
  EXPECT_TRUE(sdk::facet<sdk::GradientCheckFacet>(be)->unscale_and_check_finite(grads, 1.0f));
  // Scale 1 (no loss scaler) is a read-only check: values untouched, a late inf still found.
  c0[6] = 3.0f;
  c.set(c0);
  const float before = b.get()[123];
  EXPECT_FALSE(sdk::facet<sdk::GradientCheckFacet>(be)->unscale_and_check_finite(grads, 1.0f));
  EXPECT_EQ(b.get()[123], before);
  auto b1 = b.get();
  b1[69998] = -kInf;
  b.set(b1);
  EXPECT_TRUE(sdk::facet<sdk::GradientCheckFacet>(be)->unscale_and_check_finite(grads, 1.0f));
  b.set(b0);
  // Finite before, inf after scaling counts too.
  c0[6] = 3e38f;
  c.set(c0);
  EXPECT_TRUE(sdk::facet<sdk::GradientCheckFacet>(be)->unscale_and_check_finite(grads, 4.0f));
}

TEST(backend_cpu_mixed_precision, SumOfSquaresInDoubleAndFirstNonfinite) {
  CpuBackend be(2);
  const auto a0 = random_values(100000, 3);
  DeviceTensor a(be, DType::fp32, {100000}, a0);
  DeviceTensor b(be, DType::fp32, {3}, {1.0f, 2.0f, 3.0f});
  std::vector<TensorView> ts = {a, b};
  double expected = 14.0;
  for (float v : a0) expected += static_cast<double>(v) * v;
  EXPECT_NEAR(be.sum_of_squares(ts), expected, 1e-9 * expected);
  EXPECT_EQ(sdk::facet<sdk::GradientCheckFacet>(be)->first_nonfinite(ts), -1);
  b.set({1.0f, kNaN, 3.0f});
  EXPECT_TRUE(std::isnan(be.sum_of_squares(ts)));
  EXPECT_EQ(sdk::facet<sdk::GradientCheckFacet>(be)->first_nonfinite(ts), 1);
  b.set({1.0f, kInf, 3.0f});
  EXPECT_TRUE(std::isinf(be.sum_of_squares(ts)));
  EXPECT_EQ(sdk::facet<sdk::GradientCheckFacet>(be)->first_nonfinite(ts), 1);
}

// Σ g² has the same bits on 1, 2 and 3 threads (each piece's sum kept, the pieces' sums added in
// order) and on every ISA variant (fixed lanes, exact squares: cpu_sum_of_squares.h), and the
// gradient check's fused pass gives the bits sum_of_squares() gives for the gradients it
// unscaled, with a loss scale to remove and without. Several pieces (kPiece) of varied
// magnitude, so that an order that followed the team's partition would show; lengths that leave
// a tail of lanes.
TEST(backend_cpu_mixed_precision, SumOfSquaresIsTheSameBitsOnAnyThreadsAndIsaAndInTheFusedCheck) {
  auto big = random_values(300001, 5, -3.0f, 3.0f);
  for (std::size_t i = 0; i < big.size(); i += 997) big[i] *= 1e4f;
  const auto small = random_values(4097, 6);
  long double reference = 0.0L;
  for (float v : big) reference += static_cast<long double>(v) * v;
  for (float v : small) reference += static_cast<long double>(v) * v;
  std::optional<double> first;
  std::vector<std::pair<int, Isa>> runs;
  for (const Isa isa : runnable_isas())
    for (const int threads : {1, 2, 3}) runs.emplace_back(threads, isa);
  for (const auto& [threads, isa] : runs) {
    const IsaScope as_isa(isa);
    const std::string what = isa_name(isa) + ", " + std::to_string(threads) + " threads";
    CpuBackend be(threads);
    DeviceTensor a(be, DType::fp32, {300001}, big), b(be, DType::fp32, {4097}, small);
    std::vector<TensorView> grads = {a, b};
    const double plain = be.sum_of_squares(grads);
    if (!first) {
      first = plain;
      EXPECT_NEAR(plain, static_cast<double>(reference), 1e-12 * plain);
    }
    EXPECT_EQ(plain, *first) << what;
    auto& checks = *sdk::facet<sdk::GradientCheckFacet>(be);
    const auto kept = checks.unscale_check_and_sum_squares(grads, 1.0f);
    EXPECT_FALSE(kept.found_inf);
    EXPECT_EQ(kept.sum_of_squares, plain) << what << ", no loss scale";
    const auto scaled = checks.unscale_check_and_sum_squares(grads, 0.375f);
    EXPECT_FALSE(scaled.found_inf);
    EXPECT_EQ(scaled.sum_of_squares, be.sum_of_squares(grads)) << what << ", scaled";
    EXPECT_EQ(a.get()[997], big[997] * 0.375f);
    EXPECT_EQ(b.get()[4096], small[4096] * 0.375f) << what << ": the last lane's tail is scaled";
    // A non-finite value in a chunk's tail of lanes (4097 = 128 lanes of 32, then one) is found
    // by each of the check's passes.
    auto with_inf = small;
    with_inf[4096] = kInf;
    b.set(with_inf);
    EXPECT_TRUE(checks.unscale_check_and_sum_squares(grads, 1.0f).found_inf) << what;
    EXPECT_TRUE(checks.unscale_and_check_finite(grads, 1.0f)) << what;
    EXPECT_TRUE(checks.unscale_and_check_finite(grads, 0.5f)) << what;
    EXPECT_TRUE(checks.unscale_check_and_sum_squares(grads, 0.5f).found_inf) << what;
  }
}

struct Param {
  Param(CpuBackend& be, float p, float g, DType working_dtype = DType::bf16)
      : master(be, DType::fp32, {1, 3}, {p, p, p}),
        grad(be, DType::fp32, {1, 3}, {g, g, g}),
        working(be, working_dtype, {1, 3}),
        state1(be, DType::fp32, {1, 3}),
        state2(be, DType::fp32, {1, 3}) {}
  sdk::ParamTensors tensors() const { return {master, grad, working, state1, state2}; }
  DeviceTensor master, grad, working, state1, state2;
};

TEST(backend_cpu_optimizers, SgdMomentumDampeningWeightDecayFirstAndSecondStep) {
  CpuBackend be(2);
  Param prm(be, 1.0f, 0.5f);
  sdk::SgdHyper h;
  h.lr = 0.1f;
  h.momentum = 0.9f;
  h.dampening = 0.1f;
  h.weight_decay = 0.01f;
  h.first_step = true;
  std::vector<sdk::ParamTensors> ps = {prm.tensors()};
  sdk::facet<sdk::OptimizerFacet>(be)->sgd_update(h, ps);
  // Step 1: g = 0.5 + 0.01*1 = 0.51; buf = g (no dampening on the first step); p = 1 - 0.051.
  EXPECT_FLOAT_EQ(prm.state1.get()[0], 0.51f);
  EXPECT_FLOAT_EQ(prm.master.get()[0], 0.949f);
  EXPECT_EQ(prm.working.get()[2], bf16_to_float(float_to_bf16(prm.master.get()[2])));
  h.first_step = false;
  sdk::facet<sdk::OptimizerFacet>(be)->sgd_update(h, ps);
  // Step 2: g = 0.5 + 0.01*0.949 = 0.50949; buf = 0.9*0.51 + 0.9*0.50949 = 0.917541;
  // p = 0.949 - 0.1*0.917541 = 0.8572459.
  EXPECT_NEAR(prm.state1.get()[1], 0.917541, 1e-6);
  EXPECT_NEAR(prm.master.get()[1], 0.8572459, 1e-6);
}

TEST(backend_cpu_optimizers, SgdNesterovPlainAndGradScale) {
  CpuBackend be(1);
  Param prm(be, 1.0f, 0.5f, DType::fp16);
  sdk::SgdHyper h;
  h.lr = 0.1f;
  h.momentum = 0.9f;
  h.weight_decay = 0.01f;
  h.nesterov = true;
  std::vector<sdk::ParamTensors> ps = {prm.tensors()};
  sdk::facet<sdk::OptimizerFacet>(be)->sgd_update(h, ps);
  // g = 0.51; buf = 0.51; nesterov g = 0.51 + 0.9*0.51 = 0.969; p = 1 - 0.0969 = 0.9031.
  EXPECT_NEAR(prm.master.get()[0], 0.9031, 1e-6);
  EXPECT_EQ(prm.working.get()[0], fp16_to_float(float_to_fp16(prm.master.get()[0])));
  h.first_step = false;
  sdk::facet<sdk::OptimizerFacet>(be)->sgd_update(h, ps);
  // g = 0.5 + 0.009031 = 0.509031; buf = 0.9*0.51 + 0.509031 = 0.968031;
  // g = 0.509031 + 0.9*0.968031 = 1.3802589; p = 0.9031 - 0.13802589 = 0.76507411.
  EXPECT_NEAR(prm.master.get()[0], 0.76507411, 2e-6);

  // No momentum: no state needed; grad_scale multiplies the gradient before weight decay.
  Param plain(be, 2.0f, 1.0f);
  sdk::ParamTensors t = plain.tensors();
  t.state1 = {};
  t.working = {};
  sdk::SgdHyper hp;
  hp.lr = 0.5f;
  hp.grad_scale = 0.25f;
  hp.weight_decay = 0.1f;
  std::vector<sdk::ParamTensors> pps = {t};
  sdk::facet<sdk::OptimizerFacet>(be)->sgd_update(hp, pps);
  // g = 1*0.25 + 0.1*2 = 0.45; p = 2 - 0.225 = 1.775.
  EXPECT_FLOAT_EQ(plain.master.get()[0], 1.775f);

  // Momentum without a state buffer is a caller error.
  hp.momentum = 0.9f;
  EXPECT_THROW(sdk::facet<sdk::OptimizerFacet>(be)->sgd_update(hp, pps), sdk::BackendError);
}

TEST(backend_cpu_optimizers, AdamWBiasCorrectionAtStepsOneAndTwoAndDecoupledDecay) {
  CpuBackend be(2);
  Param prm(be, 1.0f, 0.5f);
  sdk::AdamWHyper h;
  h.lr = 0.1f;
  h.beta1 = 0.9f;
  h.beta2 = 0.999f;
  h.eps = 1e-8f;
  h.weight_decay = 0.01f;
  h.step = 1;
  std::vector<sdk::ParamTensors> ps = {prm.tensors()};
  sdk::facet<sdk::OptimizerFacet>(be)->adamw_update(h, ps);
  // Step 1: p = 1*(1 - 0.001) = 0.999; m = 0.05; v = 0.00025; m^ = 0.5; v^ = 0.25;
  // p = 0.999 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.899 (+2e-9).
  EXPECT_NEAR(prm.state1.get()[0], 0.05, 0.05 * 1e-5);  // fp32 (1 - beta) rounding
  EXPECT_NEAR(prm.state2.get()[0], 0.00025, 0.00025 * 2e-5);
  EXPECT_NEAR(prm.master.get()[0], 0.899, 1e-6);
  EXPECT_EQ(prm.working.get()[0], bf16_to_float(float_to_bf16(prm.master.get()[0])));
  h.step = 2;
  sdk::facet<sdk::OptimizerFacet>(be)->adamw_update(h, ps);
  // Step 2: p = 0.899*0.999 = 0.898101; m = 0.095; v = 0.00049975;
  // m^ = 0.095/0.19 = 0.5; v^ = 0.00049975/0.001999 = 0.25; p = 0.898101 - 0.1 = 0.798101.
  EXPECT_NEAR(prm.state1.get()[1], 0.095, 0.095 * 1e-5);
  EXPECT_NEAR(prm.state2.get()[1], 0.00049975, 0.00049975 * 2e-5);
  EXPECT_NEAR(prm.master.get()[1], 0.798101, 2e-6);

  // Zero gradient: only the decoupled decay moves p.
  Param still(be, 2.0f, 0.0f);
  std::vector<sdk::ParamTensors> sp = {still.tensors()};
  h.step = 1;
  sdk::facet<sdk::OptimizerFacet>(be)->adamw_update(h, sp);
  EXPECT_NEAR(still.master.get()[0], 2.0 * (1.0 - 0.1 * 0.01), 1e-7);

  // grad_scale applies before the moments: g = 2 * 0.25 = 0.5 gives the step-1 result.
  Param scaled(be, 1.0f, 2.0f);
  std::vector<sdk::ParamTensors> scp = {scaled.tensors()};
  h.grad_scale = 0.25f;
  sdk::facet<sdk::OptimizerFacet>(be)->adamw_update(h, scp);
  EXPECT_NEAR(scaled.master.get()[0], 0.899, 1e-6);

  h.step = 0;
  EXPECT_THROW(sdk::facet<sdk::OptimizerFacet>(be)->adamw_update(h, scp), sdk::BackendError);
  sdk::ParamTensors missing = scaled.tensors();
  missing.state2 = {};
  std::vector<sdk::ParamTensors> mp = {missing};
  h.step = 3;
  EXPECT_THROW(sdk::facet<sdk::OptimizerFacet>(be)->adamw_update(h, mp), sdk::BackendError);
}

sdk::GradientStatus status_of(const DeviceTensor& status) {
  sdk::GradientStatus out;
  std::memcpy(&out, TensorView(status).data, sizeof out);
  return out;
}

// gradient_check 1.1 and optimizer 1.1: the queued check writes the status that the gated
// updates read; they clip from it as the host would and write nothing at all on an inf.
TEST(backend_cpu_optimizers, QueuedCheckWritesTheStatusTheGatedUpdatesRead) {
  CpuBackend be(2);
  auto& checks = *sdk::facet<sdk::GradientCheckFacet>(be, 1);
  auto& updates = *sdk::facet<sdk::OptimizerFacet>(be, 1);
  DeviceTensor status(be, DType::int32, {4});
  for (const bool adamw : {false, true}) {
    Param gated(be, 1.0f, 8.0f), plain(be, 1.0f, 4.0f);
    const TensorView grads[] = {gated.grad};
    checks.queue_unscale_check(grads, 0.5f, true, status);
    // Σg² of the unscaled gradient (three 4s) is 48: at max norm 2 the coefficient clips.
    EXPECT_EQ(status_of(status).found_inf, 0);
    EXPECT_EQ(status_of(status).sum_of_squares, 48.0);
    const float coef = sdk::clip_coefficient(48.0, 2.0);
    EXPECT_EQ(coef, static_cast<float>(2.0 / (std::sqrt(48.0) + 1e-6)));
    std::vector<sdk::ParamTensors> gp = {gated.tensors()}, pp = {plain.tensors()};
    if (adamw) {
      sdk::AdamWHyper h;
      updates.adamw_update_gated(h, gp, {status, 2.0});
      h.grad_scale = coef;
      updates.adamw_update(h, pp);
    } else {
      sdk::SgdHyper h;
      h.momentum = 0.9f;
      updates.sgd_update_gated(h, gp, {status, 2.0});
      h.grad_scale = coef;
      updates.sgd_update(h, pp);
    }
    const auto r = checks.queued_check_result();
    EXPECT_FALSE(r.found_inf);
    EXPECT_EQ(r.sum_of_squares, 48.0);
    EXPECT_EQ(gated.master.get(), plain.master.get()) << (adamw ? "adamw" : "sgd");
    EXPECT_EQ(gated.state1.get(), plain.state1.get());
    EXPECT_EQ(gated.working.get(), plain.working.get());

    // An inf: found in the status, and the gated update leaves every tensor as it was.
    gated.grad.set({1.0f, kInf, 1.0f});
    checks.queue_unscale_check(grads, 1.0f, false, status);
    EXPECT_EQ(status_of(status).found_inf, 1);
    EXPECT_EQ(status_of(status).sum_of_squares, 0.0);  // not asked for
    const auto master = gated.master.get(), working = gated.working.get();
    const auto s1 = gated.state1.get(), s2 = gated.state2.get();
    if (adamw)
      updates.adamw_update_gated(sdk::AdamWHyper{}, gp, {status, 0.0});
    else
      updates.sgd_update_gated(sdk::SgdHyper{}, gp, {status, 0.0});
    EXPECT_TRUE(checks.queued_check_result().found_inf);
    EXPECT_EQ(gated.master.get(), master);
    EXPECT_EQ(gated.working.get(), working);
    EXPECT_EQ(gated.state1.get(), s1);
    EXPECT_EQ(gated.state2.get(), s2);
  }
  // Each queued check is read once; a status of another dtype or size is refused.
  EXPECT_THROW(checks.queued_check_result(), std::logic_error);
  DeviceTensor floats(be, DType::fp32, {4}), short_one(be, DType::int32, {2});
  for (const DeviceTensor* bad : {&floats, &short_one}) {
    EXPECT_THROW(checks.queue_unscale_check({}, 1.0f, false, *bad), sdk::BackendError);
    EXPECT_THROW(updates.sgd_update_gated({}, {}, {*bad, 0.0}), sdk::BackendError);
    EXPECT_THROW(updates.adamw_update_gated({}, {}, {*bad, 0.0}), sdk::BackendError);
  }
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
