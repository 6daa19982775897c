// SgdOptimizer on the CPU backend: plain, weight decay, momentum, dampening, Nesterov, clipping
// coefficient, slots and resume — against values worked out by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "cpu_params.h"
#include "forwarding_backend.h"
#include "mixtrain/sdk/backend_gradient_check.h"
#include "plugin_test_support.h"
#include "sgd_optimizer.h"

namespace mixtrain::optimizers {
namespace {

using Values = std::vector<std::pair<std::string, sdk::OptionValue>>;
using Floats = std::vector<float>;

// Two parameters: "w" (decayed) and "b" (weight_decay = false).
const Floats kW0{1.0f, 2.0f, -3.0f, 4.0f};
const Floats kGw1{0.5f, -1.0f, 0.25f, 2.0f};
const Floats kB0{0.5f, -0.5f};
const Floats kGb1{1.0f, -2.0f};
const Floats kGw2{1.0f, 1.0f, 1.0f, 1.0f};
const Floats kGb2{0.0f, 1.0f};

class SgdOptimizerTest : public ::testing::Test {
 protected:
  SgdOptimizerTest() : backend(1), params(backend) {
    params.add("w", kW0, kGw1);
    params.add("b", kB0, kGb1, /*weight_decay=*/false);
  }
  std::unique_ptr<SgdOptimizer> make(Values values) {
    auto opt = std::make_unique<SgdOptimizer>(
        test::resolve("optimizer", SgdOptimizer::option_schema(), std::move(values)),
        test::context(&sink, "optimizers", "optimizer", "sgd"));
    opt->bind(backend, params.params());
    return opt;
  }
  void step(SgdOptimizer& opt, float lr = 0.1f, float grad_scale = 1.0f) {
    opt.step(backend, params.params(), sdk::StepContext{lr, grad_scale});
  }
  void second_grads() {
    params.set_grad(0, kGw2);
    params.set_grad(1, kGb2);
  }
  Floats slot(const SgdOptimizer& opt, const std::string& name) {
    for (const auto& t : opt.state_tensors())
      if (t.name == name) return params.read(t.view);
    ADD_FAILURE() << "no state tensor " << name;
    return {};
  }

  backend_cpu::CpuBackend backend;
  test::CpuParams params;
  test::CapturingSink sink;
};

// Suite names start with the plugin name so `ctest -R optimizers` selects them.
using optimizers_sgd = SgdOptimizerTest;

TEST_F(optimizers_sgd, PlainStepUsesScheduleLrNotBaseLr) {
  auto opt = make({{"lr", 0.01}});
  EXPECT_EQ(opt->base_lr(), 0.01);
  step(*opt, 0.1f);  // p -= 0.1 * g
  EXPECT_FLOATS_NEAR(params.master(0), (Floats{0.95f, 2.1f, -3.025f, 3.8f}));
  EXPECT_FLOATS_NEAR(params.master(1), (Floats{0.4f, -0.3f}));
  EXPECT_TRUE(opt->state_tensors().empty());  // no momentum, no slots
  EXPECT_EQ(opt->applied_steps(), 1);
}

TEST_F(optimizers_sgd, GradScaleMultipliesGradients) {
  auto opt = make({});
  step(*opt, 0.1f, 0.5f);
  EXPECT_FLOATS_NEAR(params.master(0), (Floats{0.975f, 2.05f, -3.0125f, 3.9f}));
}

TEST_F(optimizers_sgd, WeightDecaySkipsParametersWithoutDecay) {
  auto opt = make({{"weight_decay", 0.1}});
  step(*opt);
  // w: g + 0.1 p = [0.6, -0.8, -0.05, 2.4]; b: no decay.
  EXPECT_FLOATS_NEAR(params.master(0), (Floats{0.94f, 2.08f, -2.995f, 3.76f}));
  EXPECT_FLOATS_NEAR(params.master(1), (Floats{0.4f, -0.3f}));
}

TEST_F(optimizers_sgd, MomentumTwoSteps) {
  auto opt = make({{"momentum", 0.9}});
  step(*opt);  // buf = g1
  EXPECT_FLOATS_NEAR(slot(*opt, "w.momentum_buffer"), kGw1);
  EXPECT_FLOATS_NEAR(params.master(0), (Floats{0.95f, 2.1f, -3.025f, 3.8f}));
  second_grads();
  step(*opt);  // buf = 0.9 g1 + g2
  EXPECT_FLOATS_NEAR(slot(*opt, "w.momentum_buffer"), (Floats{1.45f, 0.1f, 1.225f, 2.8f}));
  EXPECT_FLOATS_NEAR(slot(*opt, "b.momentum_buffer"), (Floats{0.9f, -0.8f}));
  EXPECT_FLOATS_NEAR(params.master(0), (Floats{0.805f, 2.09f, -3.1475f, 3.52f}));
  EXPECT_FLOATS_NEAR(params.master(1), (Floats{0.31f, -0.22f}));
}

TEST_F(optimizers_sgd, DampeningAppliesFromTheSecondStep) {
  auto opt = make({{"momentum", 0.9}, {"dampening", 0.5}});
  step(*opt);  // first step: buf = g1, undampened
  second_grads();
  step(*opt);  // buf = 0.9 g1 + 0.5 g2
  EXPECT_FLOATS_NEAR(slot(*opt, "w.momentum_buffer"), (Floats{0.95f, -0.4f, 0.725f, 2.3f}));
  EXPECT_FLOATS_NEAR(params.master(0), (Floats{0.855f, 2.14f, -3.0975f, 3.57f}));
}

TEST_F(optimizers_sgd, NesterovTwoSteps) {
  auto opt = make({{"momentum", 0.9}, {"nesterov", true}});
  step(*opt);  // buf = g1; p -= 0.1 (g1 + 0.9 g1)
  EXPECT_FLOATS_NEAR(params.master(0), (Floats{0.905f, 2.19f, -3.0475f, 3.62f}));
  second_grads();
  step(*opt);  // buf = 0.9 g1 + g2; p -= 0.1 (g2 + 0.9 buf)
  EXPECT_FLOATS_NEAR(params.master(0), (Floats{0.6745f, 2.081f, -3.25775f, 3.268f}));
}

TEST_F(optimizers_sgd, SlotsAreAllocatedZeroedAndFreed) {
  const auto before = backend.memory_stats().allocations;
  {
    auto opt = make({{"momentum", 0.5}});
    EXPECT_EQ(backend.memory_stats().allocations, before + 2);
    const auto tensors = opt->state_tensors();
    ASSERT_EQ(tensors.size(), 2u);
    EXPECT_EQ(tensors[0].name, "w.momentum_buffer");
    EXPECT_EQ(tensors[1].name, "b.momentum_buffer");
    EXPECT_EQ(tensors[0].view.dtype, sdk::DType::fp32);
    EXPECT_EQ(tensors[0].view.shape, params.params()[0].tensors.master.shape);
    EXPECT_EQ(params.read(tensors[0].view), Floats(4, 0.0f));
    opt->bind(backend, params.params());  // rebinding frees the old slots
    EXPECT_EQ(backend.memory_stats().allocations, before + 2);
  }
  EXPECT_EQ(backend.memory_stats().allocations, before);
  {
    auto plain = make({});
    EXPECT_EQ(backend.memory_stats().allocations, before);
  }
}

TEST_F(optimizers_sgd, ResumeKeepsMomentumRecurrence) {
  auto original = make({{"momentum", 0.9}});
  step(*original);
  const auto saved = original->save_state();
  EXPECT_EQ(saved.version, 1);
  EXPECT_EQ(saved.get<std::int64_t>("step"), 1);

  // A second run from the checkpoint: same masters, same buffers, step count restored.
  test::CpuParams resumed_params(backend);
  resumed_params.add("w", params.master(0), kGw2);
  resumed_params.add("b", params.master(1), kGb2, false);
  auto resumed = std::make_unique<SgdOptimizer>(
      test::resolve("optimizer", SgdOptimizer::option_schema(), {{"momentum", 0.9}}),
      test::context(&sink, "optimizers", "optimizer", "sgd"));
  resumed->bind(backend, resumed_params.params());
  const auto from = original->state_tensors();
  const auto to = resumed->state_tensors();
  ASSERT_EQ(from.size(), to.size());
  for (std::size_t i = 0; i < from.size(); ++i) backend.copy(to[i].view, from[i].view);
  resumed->load_state(saved);

  second_grads();
  step(*original);
  resumed->step(backend, resumed_params.params(), sdk::StepContext{0.1f, 1.0f});
  EXPECT_EQ(resumed_params.master(0), params.master(0));
  EXPECT_EQ(resumed_params.master(1), params.master(1));
  EXPECT_EQ(resumed->applied_steps(), 2);
}

TEST_F(optimizers_sgd, StepWithOtherParametersThanBoundIsAnError) {
  auto opt = make({});
  EXPECT_THROW(opt->step(backend, std::span(params.params()).first(1), {0.1f, 1.0f}),
               std::logic_error);
}

// The gated step (sdk/optimizer_gated_step.h): the update is made on the device's word and
// counted only when settled as applied, so SGD's first-step momentum waits for the first applied
// step.
TEST_F(optimizers_sgd, AGatedStepCountsOnlyWhenSettledAsApplied) {
  auto opt = make({{"momentum", 0.9}});
  ASSERT_TRUE(opt->can_gate());
  sdk::TensorView status{nullptr, sdk::DType::int32, sdk::Shape{4}};
  status.data = backend.allocate(status.bytes());
  const auto write_status = [&](int found_inf) {
    sdk::GradientStatus st;
    st.found_inf = found_inf;
    backend.copy_from_host(status, &st);
  };
  // A skipped step: nothing moves and nothing is counted.
  write_status(1);
  opt->step_gated(backend, params.params(), {0.1f, 0.0, status});
  EXPECT_THROW(step(*opt), std::logic_error);  // not settled yet
  opt->settle(false);
  EXPECT_EQ(opt->applied_steps(), 0);
  EXPECT_EQ(params.master(0), kW0);
  // The first applied step initialises the momentum buffer to g, as a first plain step does.
  write_status(0);
  opt->step_gated(backend, params.params(), {0.1f, 0.0, status});
  opt->settle(true);
  EXPECT_EQ(opt->applied_steps(), 1);
  EXPECT_FLOATS_NEAR(slot(*opt, "w.momentum_buffer"), kGw1);
  EXPECT_FLOATS_NEAR(params.master(0), (Floats{0.95f, 2.1f, -3.025f, 3.8f}));
  EXPECT_THROW(opt->settle(true), std::logic_error);  // one settle per gated step
  backend.deallocate(status.data);
}

TEST_F(optimizers_sgd, WithoutTheGatedKernelItCannotGate) {
  // A backend whose optimizer facet denies the 1.1 kernels binds, but cannot gate.
  class NoGate final : public sdk::OptimizerFacet {
   public:
    explicit NoGate(sdk::OptimizerFacet* in) : in_(in) {}
    bool supports(sdk::OptimizerOp op, std::span<const sdk::DType> d) const override {
      return sdk::introduced_in(op) == 0 && in_->supports(op, d);
    }
    void sgd_update(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> p) override {
      in_->sgd_update(h, p);
    }
    void adamw_update(const sdk::AdamWHyper& h, std::span<const sdk::ParamTensors> p) override {
      in_->adamw_update(h, p);
    }
    void sgd_update_gated(const sdk::SgdHyper&, std::span<const sdk::ParamTensors>,
                          const sdk::UpdateGate&) override {}
    void adamw_update_gated(const sdk::AdamWHyper&, std::span<const sdk::ParamTensors>,
                            const sdk::UpdateGate&) override {}

   private:
    sdk::OptimizerFacet* in_;
  };
  class Backend final : public test::ForwardingBackend {
   public:
    explicit Backend(std::shared_ptr<sdk::DeviceBackend> in)
        : ForwardingBackend(std::move(in)), facet_(sdk::facet<sdk::OptimizerFacet>(*in_)) {}
    sdk::Facet* find_facet(std::string_view name) override {
      return name == sdk::OptimizerFacet::kName ? &facet_ : in_->find_facet(name);
    }

   private:
    NoGate facet_;
  };
  Backend denying(std::make_shared<backend_cpu::CpuBackend>(1));
  auto opt =
      std::make_unique<SgdOptimizer>(test::resolve("optimizer", SgdOptimizer::option_schema(), {}),
                                     test::context(&sink, "optimizers", "optimizer", "sgd"));
  test::CpuParams own(backend);
  own.add("w", kW0, kGw1);
  opt->bind(denying, own.params());
  EXPECT_FALSE(opt->can_gate());
  EXPECT_THROW(opt->step_gated(denying, own.params(), {}), std::logic_error);
}

}  // namespace
}  // namespace mixtrain::optimizers
