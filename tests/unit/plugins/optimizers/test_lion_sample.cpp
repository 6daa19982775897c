// samples/custom_optimizer's Lion on the CPU backend, so the sample that docs/writing-plugins.md
// walks through is checked on every build: the update against Lion written out in double, the
// decoupled decay, the refreshed working copy, the momentum as a state tensor, and a resume that
// restores it (and one that does not, which must diverge).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>

#include "cpu_params.h"
#include "forwarding_backend.h"
#include "lion_optimizer.h"
#include "mixtrain/sdk/error.h"
#include "plugin_test_support.h"

namespace mixtrain_samples {
namespace {

namespace sdk = mixtrain::sdk;
namespace test = mixtrain::test;
using Values = std::vector<std::pair<std::string, sdk::OptionValue>>;
using Floats = std::vector<float>;

const Floats kW0{1.0f, 2.0f, -3.0f, 4.0f, 0.5f};
const Floats kB0{0.5f, -0.5f};
// Element 4 of w never gets a gradient: sign(0) = 0, only the decay moves it. Between the steps
// the interpolation c changes sign on elements 0 and 1 but not on 3.
const std::vector<Floats> kGw{{0.5f, -1.0f, 0.25f, 2.0f, 0.0f},
                              {-1.0f, 1.5f, 0.1f, -0.1f, 0.0f},
                              {0.3f, -0.2f, -2.0f, -0.05f, 0.0f}};
const std::vector<Floats> kGb{{1.0f, -2.0f}, {-0.5f, 0.25f}, {2.0f, 2.0f}};

// Lion (Chen et al. 2023, Algorithm 2) in double, one element at a time.
struct LionReference {
  double lr, beta1, beta2, weight_decay, grad_scale;
  Floats run(const Floats& p, const std::vector<Floats>& grads) const {
    Floats out = p;
    for (std::size_t i = 0; i < p.size(); ++i) {
      double x = p[i], m = 0;
      for (const auto& step_grads : grads) {
        const double g = step_grads[i] * grad_scale;
        const double c = beta1 * m + (1 - beta1) * g;
        x = x * (1 - lr * weight_decay) - lr * ((c > 0) - (c < 0));
        m = beta2 * m + (1 - beta2) * g;
      }
      out[i] = static_cast<float>(x);
    }
    return out;
  }
};

class LionSampleTest : public ::testing::Test {
 protected:
  LionSampleTest() : backend(1), params(backend) {
    params.add("w", kW0, kGw[0]);
    params.add("b", kB0, kGb[0], /*weight_decay=*/false);
  }
  std::unique_ptr<LionOptimizer> make(Values values, test::CpuParams& ps) {
    auto opt = std::make_unique<LionOptimizer>(
        test::resolve("optimizer", LionOptimizer::option_schema(), std::move(values)),
        test::context(&sink, "lion", "optimizer", "lion"));
    opt->bind(backend, ps.params());
    return opt;
  }
  void step(LionOptimizer& opt, test::CpuParams& ps, std::size_t t, float grad_scale = 1.0f) {
    ps.set_grad(0, kGw[t]);
    ps.set_grad(1, kGb[t]);
    opt.step(backend, ps.params(), sdk::StepContext{0.01f, grad_scale});
  }

  mixtrain::backend_cpu::CpuBackend backend;
  test::CpuParams params;
  test::CapturingSink sink;
};

// Suite names start with "optimizers" so `ctest -R optimizers` selects them.
using optimizers_lion_sample = LionSampleTest;

TEST_F(optimizers_lion_sample, ThreeStepsMatchLionWithDecoupledDecay) {
  auto opt = make({{"lr", 0.01}, {"weight_decay", 0.5}}, params);
  EXPECT_EQ(opt->base_lr(), 0.01);
  for (std::size_t t = 0; t < 3; ++t) step(*opt, params, t, /*grad_scale=*/0.5f);
  const LionReference decayed{0.01, 0.9, 0.99, 0.5, 0.5};
  const LionReference undecayed{0.01, 0.9, 0.99, 0.0, 0.5};
  EXPECT_FLOATS_NEAR(params.master(0), decayed.run(kW0, kGw));
  EXPECT_FLOATS_NEAR(params.master(1), undecayed.run(kB0, kGb));
  // Element 4 by hand: no gradient, three decays of 1 - 0.01 * 0.5.
  EXPECT_NEAR(params.master(0)[4], 0.5 * std::pow(0.995, 3), 1e-7);
  EXPECT_EQ(opt->applied_steps(), 3);
}

TEST_F(optimizers_lion_sample, MomentumIsTheStateTensorAndTheWorkingCopyIsRefreshed) {
  // A bf16 working copy of "w", as a bf16-mixed policy gives a GEMM weight.
  sdk::TensorView working{nullptr, sdk::DType::bf16, sdk::Shape{5}};
  working.data = backend.allocate(working.bytes());
  backend.cast(params.params()[0].tensors.master, working);
  std::vector<sdk::Parameter> with_working = params.params();
  with_working[0].tensors.working = working;

  const auto before = backend.memory_stats().allocations;
  auto opt = make({}, params);
  EXPECT_EQ(backend.memory_stats().allocations, before + 4) << "momentum and scratch per parameter";
  const auto tensors = opt->state_tensors();
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0].name, "w.momentum");
  EXPECT_EQ(tensors[1].name, "b.momentum");
  EXPECT_EQ(params.read(tensors[0].view), Floats(5, 0.0f));

  std::vector<std::uint16_t> old_bits(5), new_bits(5), expected_bits(5);
  backend.copy_to_host(old_bits.data(), working);
  opt->step(backend, with_working, sdk::StepContext{0.01f, 1.0f});
  // m = (1 - beta2) * g after the first step.
  Floats m1(5);
  std::transform(kGw[0].begin(), kGw[0].end(), m1.begin(), [](float g) { return 0.01f * g; });
  EXPECT_FLOATS_NEAR(params.read(tensors[0].view), m1);

  sdk::TensorView expected = working;
  expected.data = backend.allocate(expected.bytes());
  backend.cast(params.params()[0].tensors.master, expected);
  backend.copy_to_host(new_bits.data(), working);
  backend.copy_to_host(expected_bits.data(), expected);
  EXPECT_EQ(new_bits, expected_bits) << "working = bf16(master) after the step";
  EXPECT_NE(new_bits, old_bits) << "the step moved the weights, so the copy really changed";
  opt.reset();
  EXPECT_EQ(backend.memory_stats().allocations, before + 1) << "only `expected` is left";
  backend.deallocate(expected.data);
  backend.deallocate(working.data);
}

TEST_F(optimizers_lion_sample, ResumeNeedsTheRestoredMomentum) {
  auto original = make({{"weight_decay", 0.1}}, params);
  step(*original, params, 0);
  step(*original, params, 1);
  const auto saved = original->save_state();
  EXPECT_EQ(saved.get<std::int64_t>("step"), 2);

  // What the host does on resume: bind() a new optimizer to the restored masters, copy the saved
  // state tensors into the views state_tensors() returns, then load_state().
  auto restore = [&](test::CpuParams& ps, bool with_momentum) {
    ps.add("w", params.master(0), kGw[0]);
    ps.add("b", params.master(1), kGb[0], false);
    auto opt = make({{"weight_decay", 0.1}}, ps);
    const auto from = original->state_tensors();
    const auto to = opt->state_tensors();
    if (with_momentum)
      for (std::size_t i = 0; i < from.size(); ++i) {
        const auto host = params.read(from[i].view);
        backend.copy_from_host(to[i].view, host.data());
      }
    opt->load_state(saved);
    return opt;
  };
  test::CpuParams resumed_params(backend), fresh_params(backend);
  auto resumed = restore(resumed_params, true);
  auto fresh = restore(fresh_params, false);
  EXPECT_TRUE(sink.contains(sdk::LogLevel::info, "lion resumes after 2 applied steps"));

  step(*original, params, 2);
  step(*resumed, resumed_params, 2);
  step(*fresh, fresh_params, 2);
  EXPECT_EQ(resumed_params.master(0), params.master(0));
  EXPECT_EQ(resumed_params.master(1), params.master(1));
  EXPECT_EQ(resumed->save_state().values, original->save_state().values);
  // With zero momentum c = (1 - beta1) g: on element 3 c is -0.005 instead of +0.01192 (momentum
  // 0.0188), so its weight moves the other way.
  EXPECT_NE(fresh_params.master(0), params.master(0));
}

TEST_F(optimizers_lion_sample, OptionsAndStateAreChecked) {
  auto e = test::expect_config_error([] {
    test::construct<LionOptimizer>("optimizer", {{"lr", 0.5}, {"weight_decay", 2.0}});
  });
  EXPECT_TRUE(test::has(e.what(), "weight_decay")) << e.what();
  EXPECT_TRUE(test::has(e.what(), "lr * weight_decay must be < 1")) << e.what();
  EXPECT_THROW(test::construct<LionOptimizer>("optimizer", {{"beta1", 1.5}}), sdk::ConfigError);

  auto opt = make({}, params);
  auto state = opt->save_state();
  state.values["step"] = std::int64_t{-1};
  EXPECT_THROW(opt->load_state(state), sdk::CheckpointError);
  state = opt->save_state();
  state.version = 2;
  EXPECT_THROW(opt->load_state(state), sdk::CheckpointError);
  EXPECT_EQ(opt->applied_steps(), 0);
}

TEST(optimizers_lion_sample_readme, OptionTableMatchesTheSchema) {
  const std::string readme =
      std::string(MIXTRAIN_TEST_SOURCE_DIR) + "/samples/custom_optimizer/README.md";
  std::vector<std::string> expected;
  for (const auto& spec : LionOptimizer::option_schema())
    expected.push_back(test::readme_row(spec));
  EXPECT_EQ(test::readme_rows(readme, "lion"), expected) << "update the `lion` table in " << readme;
}

// A backend whose foreach facet is of another major (built against another SDK) is told apart
// from one without the facet: the message names both versions and the rebuild.
TEST(optimizers_lion_sample_facets, AForeachOfAnotherMajorIsNamedWithBothVersions) {
  struct ForeachOfAnotherMajor final : sdk::Facet {
    std::string_view name() const override { return sdk::ForeachFacet::kName; }
    sdk::FacetVersion version() const override {
      return {static_cast<std::uint16_t>(sdk::ForeachFacet::kVersion.major + 1), 0};
    }
  };
  struct Backend final : test::ForwardingBackend {
    using ForwardingBackend::ForwardingBackend;
    ForeachOfAnotherMajor other;
    bool hide = false;
    sdk::Facet* find_facet(std::string_view name) override {
      if (name != sdk::ForeachFacet::kName) return in_->find_facet(name);
      return hide ? nullptr : &other;
    }
  };
  Backend backend(std::make_shared<mixtrain::backend_cpu::CpuBackend>(1));
  test::CapturingSink sink;
  auto bind = [&] {
    LionOptimizer opt(test::resolve("optimizer", LionOptimizer::option_schema(), {}),
                      test::context(&sink, "lion", "optimizer", "lion"));
    opt.bind(backend, {});
  };
  try {
    bind();
    FAIL() << "bound to a foreach of another major";
  } catch (const sdk::BackendError& e) {
    EXPECT_TRUE(test::has(e.what(), "offers foreach " +
                                        std::to_string(sdk::ForeachFacet::kVersion.major + 1) +
                                        ".0"))
        << e.what();
    EXPECT_TRUE(test::has(e.hint(), "rebuild this plugin")) << e.hint();
  }
  backend.hide = true;
  try {
    bind();
    FAIL() << "bound to a backend without foreach";
  } catch (const sdk::BackendError& e) {
    EXPECT_TRUE(test::has(e.what(), "which backend 'cpu' does not provide")) << e.what();
  }
}

// docs/writing-plugins.md §11 shows the sample's code; every C++ block there must still be in
// the sample's sources, verbatim, so the guide cannot drift from the code that is tested.
TEST(optimizers_lion_sample_readme, TheGuideQuotesTheSampleVerbatim) {
  const std::string root(MIXTRAIN_TEST_SOURCE_DIR);
  const std::string guide = test::read_text(root + "/docs/writing-plugins.md");
  const std::string sources =
      test::read_text(root + "/samples/custom_optimizer/lion_optimizer.cpp") +
      test::read_text(root + "/samples/custom_optimizer/lion_plugin.cpp");
  const auto section = guide.find("## 11. A worked optimizer: Lion");
  ASSERT_NE(section, std::string::npos) << "the worked optimizer section is gone";
  int blocks = 0;
  for (auto at = guide.find("```cpp\n", section); at != std::string::npos;
       at = guide.find("```cpp\n", at)) {
    at += 7;
    const auto end = guide.find("```", at);
    ASSERT_NE(end, std::string::npos);
    const std::string block = guide.substr(at, end - at);
    EXPECT_TRUE(test::has(sources, block)) << "not in samples/custom_optimizer:\n" << block;
    ++blocks;
    at = end + 3;
  }
  EXPECT_GE(blocks, 4);
}

}  // namespace
}  // namespace mixtrain_samples
