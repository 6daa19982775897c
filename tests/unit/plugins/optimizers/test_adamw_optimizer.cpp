// AdamWOptimizer on the CPU backend: bias correction over two steps, decoupled decay, a
// parameter without decay, the moment slots and resume — against values computed by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "adamw_optimizer.h"
#include "cpu_params.h"
#include "mixtrain/sdk/error.h"
#include "plugin_test_support.h"

namespace mixtrain::optimizers {
namespace {

using Values = std::vector<std::pair<std::string, sdk::OptionValue>>;
using Floats = std::vector<float>;

const Floats kW0{1.0f, 2.0f, -3.0f, 4.0f};
const Floats kGw1{0.5f, -1.0f, 0.25f, 2.0f};
const Floats kB0{0.5f, -0.5f};
const Floats kGb1{1.0f, -2.0f};
const Floats kGw2{1.0f, 1.0f, 1.0f, 1.0f};
const Floats kGb2{0.0f, 1.0f};

// torch.optim.AdamW written out in double, one element at a time.
struct AdamWReference {
  double lr, beta1, beta2, eps, weight_decay;
  Floats run(Floats p, const std::vector<Floats>& grads) const {
    Floats out = p;
    for (std::size_t i = 0; i < p.size(); ++i) {
      double x = p[i], m = 0, v = 0;
      for (std::size_t t = 1; t <= grads.size(); ++t) {
        const double g = grads[t - 1][i];
        x *= 1 - lr * weight_decay;
        m = beta1 * m + (1 - beta1) * g;
        v = beta2 * v + (1 - beta2) * g * g;
        const double mhat = m / (1 - std::pow(beta1, double(t)));
        const double vhat = v / (1 - std::pow(beta2, double(t)));
        x -= lr * mhat / (std::sqrt(vhat) + eps);
      }
      out[i] = static_cast<float>(x);
    }
    return out;
  }
};

class AdamWOptimizerTest : public ::testing::Test {
 protected:
  AdamWOptimizerTest() : backend(1), params(backend) {
    params.add("w", kW0, kGw1);
    params.add("b", kB0, kGb1, /*weight_decay=*/false);
  }
  std::unique_ptr<AdamWOptimizer> make(Values values, test::CpuParams& ps) {
    auto opt = std::make_unique<AdamWOptimizer>(
        test::resolve("optimizer", AdamWOptimizer::option_schema(), std::move(values)),
        test::context(&sink, "optimizers", "optimizer", "adamw"));
    opt->bind(backend, ps.params());
    return opt;
  }
  std::unique_ptr<AdamWOptimizer> make(Values values) { return make(std::move(values), params); }
  void step(AdamWOptimizer& opt, test::CpuParams& ps) {
    opt.step(backend, ps.params(), sdk::StepContext{0.01f, 1.0f});
  }
  void second_grads() {
    params.set_grad(0, kGw2);
    params.set_grad(1, kGb2);
  }

  backend_cpu::CpuBackend backend;
  test::CpuParams params;
  test::CapturingSink sink;
};

// Suite names start with the plugin name so `ctest -R optimizers` selects them.
using optimizers_adamw = AdamWOptimizerTest;

TEST_F(optimizers_adamw, FirstStepIsSignedLrStepAfterDecoupledDecay) {
  auto opt = make({{"weight_decay", 0.1}});
  EXPECT_EQ(opt->base_lr(), 1e-3);
  step(*opt, params);
  // Bias-corrected first step: m̂ = g, v̂ = g², so p = p (1 - lr wd) - lr sign(g).
  EXPECT_FLOATS_NEAR(params.master(0), (Floats{0.989f, 2.008f, -3.007f, 3.986f}));
  // "b" has weight_decay = false: no decay factor.
  EXPECT_FLOATS_NEAR(params.master(1), (Floats{0.49f, -0.49f}));
}

TEST_F(optimizers_adamw, TwoStepsWithBiasCorrection) {
  auto opt = make({{"weight_decay", 0.1}});
  step(*opt, params);
  second_grads();
  step(*opt, params);
  const AdamWReference decayed{0.01, 0.9, 0.999, 1e-8, 0.1};
  const AdamWReference undecayed{0.01, 0.9, 0.999, 1e-8, 0.0};
  EXPECT_FLOATS_NEAR(params.master(0), decayed.run(kW0, {kGw1, kGw2}));
  EXPECT_FLOATS_NEAR(params.master(1), undecayed.run(kB0, {kGb1, kGb2}));
  // Element 0 by hand: m = 0.145, v = 0.00124975, bias corrections 0.19 and 0.001999.
  const double p2 =
      0.989 * 0.999 - 0.01 * (0.145 / 0.19) / (std::sqrt(0.00124975 / 0.001999) + 1e-8);
  EXPECT_NEAR(params.master(0)[0], p2, 1e-6);
  EXPECT_EQ(opt->applied_steps(), 2);
}

TEST_F(optimizers_adamw, MomentSlotsNamedAndFilled) {
  const auto before = backend.memory_stats().allocations;
  auto opt = make({});
  EXPECT_EQ(backend.memory_stats().allocations, before + 4);
  auto tensors = opt->state_tensors();
  ASSERT_EQ(tensors.size(), 4u);
  EXPECT_EQ(tensors[0].name, "w.exp_avg");
  EXPECT_EQ(tensors[1].name, "w.exp_avg_sq");
  EXPECT_EQ(tensors[2].name, "b.exp_avg");
  EXPECT_EQ(tensors[3].name, "b.exp_avg_sq");
  for (const auto& t : tensors)
    EXPECT_EQ(params.read(t.view), Floats(static_cast<std::size_t>(t.view.numel()), 0.0f));

  step(*opt, params);
  EXPECT_FLOATS_NEAR(params.read(tensors[0].view), (Floats{0.05f, -0.1f, 0.025f, 0.2f}));
  EXPECT_FLOATS_NEAR(params.read(tensors[1].view), (Floats{0.00025f, 0.001f, 0.0000625f, 0.004f}));
  EXPECT_FLOATS_NEAR(params.read(tensors[2].view), (Floats{0.1f, -0.2f}));
  EXPECT_FLOATS_NEAR(params.read(tensors[3].view), (Floats{0.001f, 0.004f}));
  opt.reset();
  EXPECT_EQ(backend.memory_stats().allocations, before);
}

TEST_F(optimizers_adamw, SaveLoadCarriesStepCountForBiasCorrection) {
  auto original = make({});
  step(*original, params);
  const auto saved = original->save_state();
  EXPECT_EQ(saved.get<std::int64_t>("step"), 1);

  auto restore = [&](test::CpuParams& ps, bool load_step) {
    ps.add("w", params.master(0), kGw2);
    ps.add("b", params.master(1), kGb2, false);
    auto opt = make({}, ps);
    const auto from = original->state_tensors();
    const auto to = opt->state_tensors();
    for (std::size_t i = 0; i < from.size(); ++i) backend.copy(to[i].view, from[i].view);
    if (load_step) opt->load_state(saved);
    return opt;
  };
  test::CpuParams resumed_params(backend), stepless_params(backend);
  auto resumed = restore(resumed_params, true);
  auto stepless = restore(stepless_params, false);

  second_grads();
  step(*original, params);
  step(*resumed, resumed_params);
  step(*stepless, stepless_params);
  EXPECT_EQ(resumed_params.master(0), params.master(0));
  EXPECT_EQ(resumed_params.master(1), params.master(1));
  EXPECT_EQ(resumed->save_state().values, original->save_state().values);
  // Without the step count the bias correction restarts at t = 1 and the run diverges.
  EXPECT_NE(stepless_params.master(0), params.master(0));
}

TEST_F(optimizers_adamw, MalformedStateIsRejected) {
  auto opt = make({});
  auto state = opt->save_state();
  state.values["step"] = std::int64_t{-1};
  EXPECT_THROW(opt->load_state(state), sdk::CheckpointError);
  state.values["step"] = 3.0;
  EXPECT_THROW(opt->load_state(state), sdk::CheckpointError);
  state.values.clear();
  EXPECT_THROW(opt->load_state(state), sdk::CheckpointError);
  state = opt->save_state();
  state.version = 7;
  try {
    opt->load_state(state);
    ADD_FAILURE() << "version 7 accepted";
  } catch (const sdk::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("version 7"), std::string::npos) << e.what();
  }
  EXPECT_EQ(opt->applied_steps(), 0);
}

TEST_F(optimizers_adamw, StepCountIsBoundedSoTheOneBasedStepNeverOverflows) {
  // AdamW passes count + 1 to the kernel: INT64_MAX is refused, INT64_MAX - 1 is the top, and
  // stepping from it keeps it there.
  auto opt = make({});
  auto state = opt->save_state();
  state.values["step"] = std::numeric_limits<std::int64_t>::max();
  EXPECT_THROW(opt->load_state(state), sdk::CheckpointError);
  state.values["step"] = std::numeric_limits<std::int64_t>::max() - 1;
  opt->load_state(state);
  step(*opt, params);
  EXPECT_EQ(opt->applied_steps(), std::numeric_limits<std::int64_t>::max() - 1);
  for (float x : params.master(0)) EXPECT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace mixtrain::optimizers
