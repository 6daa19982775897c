// The component conformance kit (contract in component_conformance.h): its registry, the scaler
// suite and the optimizer suite (the policy and checkpoint format suites have files of their own,
// which also hold their add_*() so that a program registering one links its suite).
#include "mixtrain/conformance/component_conformance.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include "component_training.h"
#include "conformance_fixture.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::conformance {

namespace {

std::vector<ComponentUnderTest<ScalerFactory>>& scalers() {
  static std::vector<ComponentUnderTest<ScalerFactory>> list;
  return list;
}
std::vector<ComponentUnderTest<OptimizerFactory>>& optimizers() {
  static std::vector<ComponentUnderTest<OptimizerFactory>> list;
  return list;
}

template <class T>
std::function<std::shared_ptr<T>()> from_plugin(std::vector<std::filesystem::path> paths,
                                                sdk::ComponentKind kind, std::string name,
                                                std::map<std::string, sdk::OptionValue> options) {
  // One registry per factory, kept by it: the libraries stay loaded while a component lives.
  auto registry = std::make_shared<core::PluginRegistry>(&core::host_log_sink());
  registry->scan(paths);
  return [registry, kind, name = std::move(name), options = std::move(options)] {
    const core::LoadedComponent& c = registry->require(kind, name);
    std::vector<sdk::RawOption> raw;
    for (const auto& [key, value] : options) raw.push_back({key, value, {}});
    const std::string table = std::string(sdk::component_kind_name(kind)) + "." + name;
    return registry->create<T>(c, sdk::Options::resolve(table, c.info.options, raw, {}));
  };
}

}  // namespace

void add_scaler(std::string name, ScalerFactory make) {
  std::vector<std::string> taken;
  for (const auto& c : scalers()) taken.push_back(c.name);
  internal::check_test_name("scaler", name, taken);
  scalers().push_back({std::move(name), std::move(make)});
}
void add_optimizer(std::string name, OptimizerFactory make) {
  std::vector<std::string> taken;
  for (const auto& c : optimizers()) taken.push_back(c.name);
  internal::check_test_name("optimizer", name, taken);
  optimizers().push_back({std::move(name), std::move(make)});
}
const std::vector<ComponentUnderTest<ScalerFactory>>& registered_scalers() {
  return scalers();
}
const std::vector<ComponentUnderTest<OptimizerFactory>>& registered_optimizers() {
  return optimizers();
}

ScalerFactory scaler_from_plugin(std::vector<std::filesystem::path> folders_or_files,
                                 std::string name,
                                 std::map<std::string, sdk::OptionValue> options) {
  return from_plugin<sdk::LossScaler>(std::move(folders_or_files), sdk::ComponentKind::scaler,
                                      std::move(name), std::move(options));
}
OptimizerFactory optimizer_from_plugin(std::vector<std::filesystem::path> folders_or_files,
                                       std::string name,
                                       std::map<std::string, sdk::OptionValue> options) {
  return from_plugin<sdk::Optimizer>(std::move(folders_or_files), sdk::ComponentKind::optimizer,
                                     std::move(name), std::move(options));
}
PolicyFactory policy_from_plugin(std::vector<std::filesystem::path> folders_or_files,
                                 std::string name,
                                 std::map<std::string, sdk::OptionValue> options) {
  return from_plugin<sdk::PrecisionPolicy>(std::move(folders_or_files), sdk::ComponentKind::policy,
                                           std::move(name), std::move(options));
}
CheckpointFormatFactory checkpoint_format_from_plugin(
    std::vector<std::filesystem::path> folders_or_files, std::string name,
    std::map<std::string, sdk::OptionValue> options) {
  return from_plugin<sdk::CheckpointFormat>(std::move(folders_or_files),
                                            sdk::ComponentKind::checkpoint_format, std::move(name),
                                            std::move(options));
}

namespace {

using internal::DeviceTensor;
using sdk::DType;
using sdk::Shape;

using internal::failure_text;

// --- Scalers -----------------------------------------------------------------------------------

class ScalerConformance : public ::testing::TestWithParam<ComponentUnderTest<ScalerFactory>> {
 protected:
  std::shared_ptr<sdk::LossScaler> make() {
    try {
      return GetParam().make();
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  void SetUp() override {
    try {
      scaler_ = GetParam().make();
    } catch (const std::exception& e) {
      // Unlike a backend's (no device here), a scaler's factory has no reason to fail on one
      // machine and not another: a wrong folder, name or option must not pass as skipped.
      FAIL() << "scaler '" << GetParam().name << "' could not be made: " << failure_text(e);
    }
  }
  std::shared_ptr<sdk::LossScaler> scaler_;
};

// Overflow on steps k with k % 5 == 3 and, every 40 steps, on 6 steps in a row: backs-off,
// growth and recovery alike.
bool overflow_at(int k) {
  return k % 5 == 3 || k % 40 >= 34;
}

bool same(const sdk::ScalerDecision& a, const sdk::ScalerDecision& b) {
  return a.apply_step == b.apply_step &&
         std::memcmp(&a.scale_before, &b.scale_before, sizeof(float)) == 0 &&
         std::memcmp(&a.scale_after, &b.scale_after, sizeof(float)) == 0;
}

TEST_P(ScalerConformance, ANonFiniteStepIsNeverApplied) {
  for (int k = 0; k < 200; ++k) {
    const bool inf = overflow_at(k);
    const float before = scaler_->scale();
    const sdk::ScalerDecision d = scaler_->update(inf);
    if (inf) {
      ASSERT_FALSE(d.apply_step) << "update(true) applied step " << k;
    }
    EXPECT_EQ(d.scale_before, before) << "step " << k << ": scale_before is not scale()";
    EXPECT_EQ(d.scale_after, scaler_->scale()) << "step " << k << ": scale_after is not scale()";
  }
}

TEST_P(ScalerConformance, TheScaleIsAlwaysAFiniteNumberAboveZero) {
  const auto check = [&](const char* phase, int k) {
    const float s = scaler_->scale();
    ASSERT_TRUE(std::isfinite(s) && s > 0.0f) << phase << ", step " << k << ": scale " << s;
  };
  check("at start", 0);
  for (int k = 0; k < 500; ++k) {  // overflows only: a dynamic scaler backs off to its floor
    scaler_->update(true);
    check("after overflows", k);
  }
  for (int k = 0; k < 50000; ++k) {  // clean steps only: it grows to its ceiling
    scaler_->update(false);
    check("after clean steps", k);
  }
}

TEST_P(ScalerConformance, TheStateSavedAtAStepReplaysTheSameDecisions) {
  for (int k = 0; k < 37; ++k) scaler_->update(overflow_at(k));
  const sdk::ComponentState saved = scaler_->save_state();
  std::vector<sdk::ScalerDecision> want;
  for (int k = 37; k < 120; ++k) want.push_back(scaler_->update(overflow_at(k)));
  auto fresh = make();
  ASSERT_NE(fresh, nullptr);
  fresh->load_state(saved);
  for (int k = 37; k < 120; ++k)
    ASSERT_TRUE(same(fresh->update(overflow_at(k)), want[static_cast<std::size_t>(k - 37)]))
        << "the loaded state decided step " << k << " otherwise";
}

// The gated update asks update(false) first with the state saved, and, when the gradients were not
// finite after all, loads that state and asks update(true): the decisions must be those of
// update(true) alone.
TEST_P(ScalerConformance, AnUpdateUndoneByLoadStateLeavesNoTrace) {
  auto direct = make();
  ASSERT_NE(direct, nullptr);
  for (int k = 0; k < 120; ++k) {
    const bool inf = overflow_at(k);
    const sdk::ComponentState before = scaler_->save_state();
    sdk::ScalerDecision d = scaler_->update(false);
    if (inf) {
      scaler_->load_state(before);
      d = scaler_->update(true);
    }
    ASSERT_TRUE(same(d, direct->update(inf))) << "step " << k << " decided otherwise";
  }
}

// --- Optimizers ---------------------------------------------------------------------------------

struct ParamSpec {
  const char* name;
  Shape shape;
  std::optional<DType> working;
  bool weight_decay;
};
const ParamSpec kParams[] = {
    {"fc1.weight", Shape{8, 16}, DType::bf16, true},
    {"fc1.bias", Shape{8}, std::nullopt, false},
    {"fc2.weight", Shape{4, 8}, DType::fp16, true},
    {"fc2.bias", Shape{4}, DType::bf16, false},
};

// The parameters of one run on one backend: masters, gradients and working copies.
class Params {
 public:
  Params(sdk::DeviceBackend& b, unsigned seed) : b_(b) {
    for (const ParamSpec& spec : kParams) {
      auto& p = owned_.emplace_back();
      p.master = std::make_unique<DeviceTensor>(b, DType::fp32, spec.shape);
      p.grad = std::make_unique<DeviceTensor>(b, DType::fp32, spec.shape);
      if (spec.working) p.working = std::make_unique<DeviceTensor>(b, *spec.working, spec.shape);
      const auto n = static_cast<std::size_t>(spec.shape.numel());
      b.copy_from_host(p.master->view(), internal::random_values(n, seed++).data());
      params_.push_back({spec.name,
                         {p.master->view(),
                          p.grad->view(),
                          p.working ? p.working->view() : sdk::TensorView{},
                          {},
                          {}},
                         spec.weight_decay});
    }
    refresh_working();
  }
  // The masters set to `masters` (one vector a parameter), and the working copies from them.
  void set_masters(const std::vector<std::vector<float>>& masters) {
    for (std::size_t i = 0; i < owned_.size(); ++i)
      b_.copy_from_host(owned_[i].master->view(), masters[i].data());
    refresh_working();
  }
  // Gradients of step `step`, multiplied by `times` (exactly: a power of two).
  void set_grads(int step, float times = 1.0f) {
    for (std::size_t i = 0; i < owned_.size(); ++i) {
      auto g = internal::random_values(
          static_cast<std::size_t>(params_[i].tensors.grad.shape.numel()),
          1000u + 31u * static_cast<unsigned>(step) + static_cast<unsigned>(i), -0.1f, 0.1f);
      for (auto& x : g) x *= times;
      b_.copy_from_host(owned_[i].grad->view(), g.data());
    }
  }
  std::vector<std::vector<float>> masters() const {
    std::vector<std::vector<float>> out;
    for (const auto& p : params_) {
      std::vector<float> v(static_cast<std::size_t>(p.tensors.master.shape.numel()));
      b_.copy_to_host(v.data(), p.tensors.master);
      out.push_back(std::move(v));
    }
    return out;
  }
  std::span<const sdk::Parameter> get() const { return params_; }

 private:
  void refresh_working() {
    for (const auto& p : params_)
      if (p.tensors.working.data != nullptr) b_.cast(p.tensors.master, p.tensors.working);
  }
  struct Owned {
    std::unique_ptr<DeviceTensor> master, grad, working;
  };
  sdk::DeviceBackend& b_;
  std::vector<Owned> owned_;
  std::vector<sdk::Parameter> params_;
};

std::vector<std::uint8_t> bytes_of(sdk::DeviceBackend& b, const sdk::TensorView& v) {
  std::vector<std::uint8_t> out(v.bytes());
  b.copy_to_host(out.data(), v);
  return out;
}

class OptimizerConformance : public ::testing::TestWithParam<ComponentUnderTest<OptimizerFactory>> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(reference_factory()) << "set_reference() was not called before RUN_ALL_TESTS";
    backend_ = reference_factory()();
    try {
      optimizer_ = GetParam().make();
    } catch (const std::exception& e) {
      FAIL() << "optimizer '" << GetParam().name << "' could not be made: " << failure_text(e);
    }
  }
  void TearDown() override {
    optimizer_.reset();  // its state goes back to the backend first
  }
  std::shared_ptr<sdk::Optimizer> fresh() { return GetParam().make(); }
  // `steps` steps of gradients set_grads(first..), at lr 0.01.
  static void run(sdk::DeviceBackend& b, sdk::Optimizer& opt, Params& p, int first, int steps,
                  float grad_scale = 1.0f, float times = 1.0f) {
    for (int k = first; k < first + steps; ++k) {
      p.set_grads(k, times);
      opt.step(b, p.get(), {0.01f, grad_scale});
    }
  }
  std::shared_ptr<sdk::DeviceBackend> backend_;
  std::shared_ptr<sdk::Optimizer> optimizer_;
};

TEST_P(OptimizerConformance, WorkingCopiesHoldTheUpdatedMasters) {
  auto& b = *backend_;
  Params p(b, 1);
  optimizer_->bind(b, p.get());
  const auto start = p.masters();
  for (int k = 0; k < 3; ++k) {
    run(b, *optimizer_, p, k, 1);
    for (const sdk::Parameter& param : p.get()) {
      const sdk::TensorView& w = param.tensors.working;
      if (w.data == nullptr) continue;
      std::vector<float> master(static_cast<std::size_t>(w.shape.numel()));
      b.copy_to_host(master.data(), param.tensors.master);
      std::vector<std::uint16_t> want(master.size()), got(master.size());
      sdk::convert(std::span<const float>(master), std::span<std::uint16_t>(want), w.dtype,
                   sdk::EncodeOptions{});
      b.copy_to_host(got.data(), w);
      ASSERT_EQ(got, want) << "after step " << k << ", " << param.name << "'s "
                           << sdk::dtype_name(w.dtype)
                           << " working copy is not its master rounded (optimizer.h: step() "
                              "refreshes it)";
    }
  }
  EXPECT_NE(p.masters(), start) << "three steps with gradients and lr 0.01 left every master";
}

TEST_P(OptimizerConformance, StateTensorsAreFp32EachNameOnce) {
  auto& b = *backend_;
  Params p(b, 2);
  optimizer_->bind(b, p.get());
  std::set<std::string> names;
  for (const auto& t : optimizer_->state_tensors()) {
    EXPECT_TRUE(names.insert(t.name).second) << "state tensor '" << t.name << "' twice";
    EXPECT_EQ(t.view.dtype, DType::fp32) << t.name;
  }
}

TEST_P(OptimizerConformance, TheStateSavedAfterAStepContinuesBitForBit) {
  auto& b = *backend_;
  Params a(b, 3);
  optimizer_->bind(b, a.get());
  run(b, *optimizer_, a, 0, 2);
  const auto masters = a.masters();
  std::vector<std::pair<std::string, std::vector<std::uint8_t>>> state;
  for (const auto& t : optimizer_->state_tensors()) state.emplace_back(t.name, bytes_of(b, t.view));
  const sdk::ComponentState scalars = optimizer_->save_state();
  run(b, *optimizer_, a, 2, 3);
  const auto want = a.masters();

  auto resumed = fresh();
  Params r(b, 99);  // other draws, overwritten by the saved masters
  resumed->bind(b, r.get());
  r.set_masters(masters);
  const auto views = resumed->state_tensors();
  ASSERT_EQ(views.size(), state.size()) << "a new optimizer names other state tensors";
  for (const auto& saved : state) {
    // Not a structured binding: clang 14 (the sanitizer leg's) cannot capture one in a lambda.
    const std::string& name = saved.first;
    const auto& bytes = saved.second;
    const auto it = std::find_if(views.begin(), views.end(),
                                 [&](const sdk::NamedTensorView& v) { return v.name == name; });
    ASSERT_NE(it, views.end()) << "a new optimizer has no state tensor '" << name << "'";
    ASSERT_EQ(it->view.bytes(), bytes.size()) << name;
    b.copy_from_host(it->view, bytes.data());
  }
  resumed->load_state(scalars);
  run(b, *resumed, r, 2, 3);
  EXPECT_EQ(r.masters(), want) << "the loaded state continued otherwise";
}

TEST_P(OptimizerConformance, TheGradientScaleMultipliesTheGradients) {
  auto& b = *backend_;
  Params scaled(b, 4), multiplied(b, 4);
  optimizer_->bind(b, scaled.get());
  auto other = fresh();
  other->bind(b, multiplied.get());
  // 0.25 is the clipping coefficient a host passes; the gradients times 0.25 are exact.
  run(b, *optimizer_, scaled, 0, 3, /*grad_scale=*/0.25f);
  run(b, *other, multiplied, 0, 3, /*grad_scale=*/1.0f, /*times=*/0.25f);
  const auto x = scaled.masters(), y = multiplied.masters();
  for (std::size_t i = 0; i < x.size(); ++i)
    for (std::size_t j = 0; j < x[i].size(); ++j)
      ASSERT_NEAR(x[i][j], y[i][j], 1e-6f * std::max(1.0f, std::fabs(y[i][j])))
          << kParams[i].name << "[" << j << "]: step() with grad_scale 0.25 differs from step() "
          << "with the gradients times 0.25";
}

TEST_P(OptimizerConformance, TwoRunsFromTheSameInputsGiveTheSameBits) {
  auto& b = *backend_;
  Params x(b, 5), y(b, 5);
  optimizer_->bind(b, x.get());
  auto other = fresh();
  other->bind(b, y.get());
  run(b, *optimizer_, x, 0, 4);
  run(b, *other, y, 0, 4);
  EXPECT_EQ(x.masters(), y.masters());
}

INSTANTIATE_TEST_SUITE_P(scaler, ScalerConformance, ::testing::ValuesIn(registered_scalers()),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(optimizer, OptimizerConformance,
                         ::testing::ValuesIn(registered_optimizers()),
                         [](const auto& info) { return info.param.name; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ScalerConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(OptimizerConformance);

}  // namespace
}  // namespace mixtrain::conformance
