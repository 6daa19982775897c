// Fused unscale + finite check, sum of squares, first non-finite, and the fused SGD / AdamW
// updates against values computed by hand (PyTorch semantics as stated in device_backend.h).
#include <cmath>
#include <cstring>
#include <deque>
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

// The updates' element loops run per ISA (cpu_optimizer_kernels.h): on each variant this CPU runs,
// on one thread and two, every element is what the documented formula gives with each step one
// IEEE operation (no FMA: this test file targets the baseline, which has none), over a length that
// crosses the backend's pieces and leaves a vector tail.
TEST(backend_cpu_optimizers, UpdatesGiveTheFormulasBitsOnEveryIsaAndThreadCount) {
  constexpr std::size_t n = 70001;
  const auto p0 = random_values(n, 11, -2.0f, 2.0f), g = random_values(n, 12, -1.0f, 1.0f);
  const auto m0 = random_values(n, 13, -0.1f, 0.1f), v0 = random_values(n, 14, 0.0f, 0.01f);
  sdk::AdamWHyper ah;
  ah.lr = 3e-3f;
  ah.weight_decay = 0.1f;
  ah.beta2 = 0.95f;
  ah.step = 7;
  ah.grad_scale = 0.625f;
  // The bias corrections in double from the float betas, as the backend and PyTorch take them.
  const double bc1 = 1.0 - std::pow(static_cast<double>(ah.beta1), 7.0);
  const double bc2 = 1.0 - std::pow(static_cast<double>(ah.beta2), 7.0);
  const float step_size = static_cast<float>(static_cast<double>(ah.lr) / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - ah.lr * ah.weight_decay;
  std::vector<float> ap(n), am(n), av(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i] * ah.grad_scale;
    const float b1g = (1.0f - ah.beta1) * gi, b2g = (1.0f - ah.beta2) * gi * gi;
    am[i] = ah.beta1 * m0[i] + b1g;
    av[i] = ah.beta2 * v0[i] + b2g;
    const float denom = std::sqrt(av[i]) / bc2_sqrt + ah.eps;
    const float decayed = p0[i] * decay, moved = step_size * am[i] / denom;
    ap[i] = decayed - moved;
  }
  sdk::SgdHyper sh;
  sh.lr = 0.05f;
  sh.momentum = 0.9f;
  sh.dampening = 0.25f;
  sh.weight_decay = 1e-3f;
  sh.nesterov = false;
  sh.first_step = false;
  sh.grad_scale = 0.5f;
  std::vector<float> sp(n), sm(n), plain(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float wd = sh.weight_decay * p0[i], gi = g[i] * sh.grad_scale + wd;
    const float kept = sh.momentum * m0[i], added = (1.0f - sh.dampening) * gi;
    sm[i] = kept + added;
    const float moved = sh.lr * sm[i];
    sp[i] = p0[i] - moved;
    const float plain_moved = sh.lr * gi;
    plain[i] = p0[i] - plain_moved;
  }
  for (const auto& [threads, isa] : thread_and_isa_runs()) {
    const IsaScope as_isa(isa);
    const std::string what = isa_name(isa) + ", " + std::to_string(threads) + " threads";
    CpuBackend be(threads);
    auto& opt = *sdk::facet<sdk::OptimizerFacet>(be);
    auto param = [&](bool second_state) {
      std::deque<DeviceTensor> t;  // DeviceTensor stays where it was made
      t.emplace_back(be, DType::fp32, Shape{std::int64_t{n}}, p0);
      t.emplace_back(be, DType::fp32, Shape{std::int64_t{n}}, g);
      t.emplace_back(be, DType::bf16, Shape{std::int64_t{n}});
      t.emplace_back(be, DType::fp32, Shape{std::int64_t{n}}, m0);
      if (second_state) t.emplace_back(be, DType::fp32, Shape{std::int64_t{n}}, v0);
      return t;
    };
    auto adamw = param(true);
    const std::vector<sdk::ParamTensors> ap_list = {
        {adamw[0], adamw[1], adamw[2], adamw[3], adamw[4]}};
    opt.adamw_update(ah, ap_list);
    auto sgd = param(false);
    const std::vector<sdk::ParamTensors> sp_list = {{sgd[0], sgd[1], sgd[2], sgd[3], {}}};
    opt.sgd_update(sh, sp_list);
    auto nomom = param(false);
    const std::vector<sdk::ParamTensors> np_list = {{nomom[0], nomom[1], nomom[2], {}, {}}};
    sdk::SgdHyper plain_h = sh;
    plain_h.momentum = 0.0f;
    opt.sgd_update(plain_h, np_list);
    const auto got_ap = adamw[0].get(), got_am = adamw[3].get(), got_av = adamw[4].get();
    const auto got_sp = sgd[0].get(), got_sm = sgd[3].get(), got_plain = nomom[0].get();
    const auto working = adamw[2].get();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const bool same = got_ap[i] == ap[i] && got_am[i] == am[i] && got_av[i] == av[i] &&
                        got_sp[i] == sp[i] && got_sm[i] == sm[i] && got_plain[i] == plain[i] &&
                        working[i] == bf16_to_float(float_to_bf16(ap[i]));
      if (!same && wrong++ == 0)
        ADD_FAILURE() << what << ": element " << i << " AdamW p " << got_ap[i] << " vs " << ap[i]
                      << ", SGD p " << got_sp[i] << " vs " << sp[i] << ", plain SGD p "
                      << got_plain[i] << " vs " << plain[i];
    }
    EXPECT_EQ(wrong, 0u) << what;
  }
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
