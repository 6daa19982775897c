// The component kit's precision policy suite (contract in component_conformance.h): small models
// trained through the host under the policy, its plans of the ops the host described, its operand
// scales and its saved state.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "component_training.h"
#include "mixtrain/conformance/component_conformance.h"
#include "mixtrain/core/train/trainer.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::conformance {

namespace {
std::vector<ComponentUnderTest<PolicyFactory>>& policies() {
  static std::vector<ComponentUnderTest<PolicyFactory>> list;
  return list;
}
}  // namespace

void add_policy(std::string name, PolicyFactory make) {
  std::vector<std::string> taken;
  for (const auto& c : policies()) taken.push_back(c.name);
  internal::check_test_name("policy", name, taken);
  policies().push_back({std::move(name), std::move(make)});
}
const std::vector<ComponentUnderTest<PolicyFactory>>& registered_policies() {
  return policies();
}

namespace {

namespace fs = std::filesystem;
using internal::TinyModel;

std::string dtypes_of(const sdk::OpPrecision& p) {
  return "weight " + std::string(sdk::dtype_name(p.weight)) + ", gemm_input " +
         std::string(sdk::dtype_name(p.gemm_input)) + ", activation " +
         std::string(sdk::dtype_name(p.activation)) + ", activation_grad " +
         std::string(sdk::dtype_name(p.activation_grad));
}
bool same(const sdk::OpPrecision& a, const sdk::OpPrecision& b) {
  return a.weight == b.weight && a.gemm_input == b.gemm_input && a.activation == b.activation &&
         a.activation_grad == b.activation_grad;
}
bool plans_fp16(const sdk::OpPrecision& p) {
  for (const sdk::DType t : {p.weight, p.gemm_input, p.activation, p.activation_grad})
    if (t == sdk::DType::fp16) return true;
  return false;
}

class PolicyConformance : public ::testing::TestWithParam<ComponentUnderTest<PolicyFactory>> {
 protected:
  void SetUp() override {
    try {
      policy_ = GetParam().make();
    } catch (const std::exception& e) {
      FAIL() << "policy '" << GetParam().name
             << "' could not be made: " << internal::failure_text(e);
    }
  }

  // The tiny model's session with a new policy of the factory's; sets over the kit's config.
  internal::TinySession session(TinyModel model, const std::vector<std::string>& sets) {
    auto s = internal::tiny_session(model, sets, scratch_.path());
    s.components.policy = GetParam().make();
    return s;
  }
  // Trains it. `plan_refused`, when given, receives a ConfigError of the host's planning (the
  // Trainer's construction) instead of its being thrown.
  core::TrainSummary train(internal::TinySession s, const fs::path& run_dir,
                           std::vector<sdk::OpDescription>* described = nullptr,
                           std::optional<fs::path> resume = {},
                           std::string* plan_refused = nullptr) {
    core::TrainOptions opt;
    opt.run_dir = run_dir;
    opt.resume = std::move(resume);
    std::unique_ptr<core::Trainer> trainer;
    try {
      trainer = std::make_unique<core::Trainer>(s.experiment, std::move(s.components), opt);
    } catch (const sdk::ConfigError& e) {
      if (plan_refused == nullptr) throw;
      *plan_refused = internal::failure_text(e);
      return {};
    }
    if (described != nullptr)
      for (const auto& layer : trainer->model().layers())
        described->push_back(layer->description());
    return trainer->run();
  }

  std::shared_ptr<sdk::PrecisionPolicy> policy_;
  internal::ScratchFolder scratch_;
};

// The drop of the loss over a run: the first 4 steps' mean less the last 4 steps'.
double loss_drop(const std::map<std::int64_t, double>& by_step) {
  std::vector<double> losses;
  for (const auto& [step, loss] : by_step) losses.push_back(loss);
  if (losses.size() < 8) return std::nan("");
  double first = 0, last = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    first += losses[i];
    last += losses[losses.size() - 1 - i];
  }
  return (first - last) / 4;
}

// A policy's run learns: its loss falls by at least kLearnsShare of what the same run falls in
// FP32 (a flat loss, say from every operand saturated by a huge scale, falls by noise alone).
// The built-in policies, nvfp4 included, fall by at least 90% of FP32's on the kit's models.
constexpr double kLearnsShare = 0.5;

// The kit's model trained in FP32 under its own config, once per program: its loss drop. A
// failure there is the kit's or the machine's, never the policy's.
double fp32_drop(TinyModel model, const fs::path& scratch) {
  static std::map<TinyModel, double> drops;
  if (const auto it = drops.find(model); it != drops.end()) return it->second;
  const std::string name(internal::tiny_model_name(model));
  auto fp32 = internal::tiny_session(model, {"run.steps=16"}, scratch);
  core::TrainOptions opt;
  opt.run_dir = scratch / (name + "-fp32");
  core::Trainer(fp32.experiment, std::move(fp32.components), opt).run();
  return drops[model] = loss_drop(internal::step_losses(opt.run_dir));
}

// The MLP must train; the GPT and the CNN too, unless the host refuses the policy's plan of one of
// their ops with a ConfigError (its message is printed). Then every op the host described: planned
// the same twice and by a new policy adapted to the same backend, in floating dtypes, and a policy
// planning fp16 anywhere says it needs a loss scaler.
TEST_P(PolicyConformance, TrainsSmallModelsAndPlansTheirOpsDeterministically) {
  for (const TinyModel model : {TinyModel::mlp, TinyModel::gpt, TinyModel::cnn}) {
    const std::string name(internal::tiny_model_name(model));
    std::vector<sdk::OpDescription> ops;
    const double reference = fp32_drop(model, scratch_.path());
    ASSERT_GT(reference, 0.0) << name << ": the kit's own FP32 run did not learn";
    auto s = session(model, {"run.steps=16"});
    const sdk::BackendCapabilities caps = s.components.backend->capabilities();
    std::string refused;
    const core::TrainSummary sum =
        train(std::move(s), scratch_.path() / name, &ops, std::nullopt, &refused);
    if (!refused.empty()) {
      if (model == TinyModel::mlp) {
        ADD_FAILURE() << "the host refused the policy's plan of the MLP (linear and relu only): "
                      << refused;
      } else {
        std::cout << "[   NOTE   ] policy '" << GetParam().name << "' does not plan the kit's "
                  << name << ": " << refused << '\n';
      }
      continue;
    }
    EXPECT_FALSE(sum.diverged) << name << ": " << sum.divergence;
    EXPECT_GE(sum.applied_steps, sum.steps / 2) << name << ": most steps were skipped";
    const double drop = loss_drop(internal::step_losses(scratch_.path() / name));
    EXPECT_TRUE(drop >= kLearnsShare * reference)
        << name << ": the loss fell by " << drop << " over 16 steps (first 4 steps' mean less the "
        << "last 4's), where FP32 falls by " << reference << ": the policy's run does not learn";

    ASSERT_FALSE(ops.empty()) << name;
    const auto fresh = GetParam().make();
    fresh->adapt_to(caps);
    bool fp16 = false;
    for (const auto& op : ops) {
      sdk::OpPrecision b, c;
      try {
        b = fresh->plan(op);
        c = fresh->plan(op);
      } catch (const std::exception& e) {
        ADD_FAILURE() << name << ": plan('" << op.name << "') threw, where the host's run of the "
                      << "same op did not: " << internal::failure_text(e);
        continue;
      }
      EXPECT_TRUE(same(b, c)) << name << ": op '" << op.name << "' (" << op.kind
                              << ") planned twice: " << dtypes_of(b) << ", then " << dtypes_of(c);
      for (const sdk::DType t : {b.weight, b.gemm_input, b.activation, b.activation_grad}) {
        EXPECT_TRUE(sdk::is_floating(t))
            << name << ": op '" << op.name << "' planned " << dtypes_of(b);
      }
      fp16 = fp16 || plans_fp16(b);
    }
    if (fp16) {
      EXPECT_TRUE(fresh->needs_loss_scaling())
          << name << ": the policy plans fp16 but needs_loss_scaling() is false, so `check` "
          << "would not warn of a run without a loss scaler";
    }
  }
}

// Twelve steps twice (the same bits), and steps 7 to 12 again from the checkpoint of step 6: the
// policy's state (its FP8 scales, say) saved and loaded through a real checkpoint.
TEST_P(PolicyConformance, AResumedRunRepeatsTheLossesBitForBit) {
  const std::vector<std::string> sets = {"run.steps=12", "checkpoint.every=6"};
  train(session(TinyModel::mlp, sets), scratch_.path() / "full");
  train(session(TinyModel::mlp, sets), scratch_.path() / "again");
  train(session(TinyModel::mlp, sets), scratch_.path() / "resumed", nullptr,
        scratch_.path() / "full" / "checkpoints" / "step-00000006.mxt");
  const auto full = internal::step_losses(scratch_.path() / "full");
  const auto again = internal::step_losses(scratch_.path() / "again");
  const auto resumed = internal::step_losses(scratch_.path() / "resumed");
  ASSERT_EQ(full.size(), 12u);
  for (const auto& [step, loss] : full) {
    ASSERT_TRUE(again.count(step)) << "step " << step;
    EXPECT_EQ(std::bit_cast<std::uint64_t>(again.at(step)), std::bit_cast<std::uint64_t>(loss))
        << "two runs differ at step " << step << ": " << loss << " and " << again.at(step);
  }
  ASSERT_FALSE(resumed.empty());
  EXPECT_EQ(resumed.begin()->first, 7);
  for (const auto& [step, loss] : resumed)
    EXPECT_EQ(std::bit_cast<std::uint64_t>(loss), std::bit_cast<std::uint64_t>(full.at(step)))
        << "the resumed run differs at step " << step << ": " << loss << " where it was "
        << full.at(step);
}

// The amaxes a cast may measure, a tensor of NaN or inf included, and a step's outcome (a skipped
// step's amaxes come from an overflowed pass).
constexpr float kAmaxes[] = {1.0f,
                             0.0f,
                             1e-30f,
                             448.0f,
                             57344.0f,
                             1e30f,
                             std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN(),
                             3.5f,
                             0.01f,
                             2.0f,
                             100.0f};

std::vector<sdk::OperandSlot> kit_slots() {
  std::vector<sdk::OperandSlot> slots;
  for (const char* node : {"fc1", "head"})
    for (const auto role :
         {sdk::OperandRole::input, sdk::OperandRole::weight, sdk::OperandRole::grad_output})
      slots.emplace_back(node, "matmul", role);
  return slots;
}

// One step of the host's calls for every slot, in the host's order; each scaling checked and
// returned in slot order.
std::vector<sdk::OperandScaling> drive_step(sdk::PrecisionPolicy& p, int k, std::string* bad) {
  std::vector<sdk::OperandScaling> out;
  const auto slots = kit_slots();
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const float amax = kAmaxes[(static_cast<std::size_t>(k) + i) % std::size(kAmaxes)];
    if (p.wants_current_amax()) p.record_amax(slots[i], amax);
    const sdk::OperandScaling s = p.operand_scaling(slots[i]);
    if (!p.wants_current_amax()) p.record_amax(slots[i], amax);
    const bool ok = sdk::is_fp8(s.dtype) && std::isfinite(s.scale) && s.scale > 0 &&
                    std::isfinite(s.scale_inv) && s.scale_inv > 0 &&
                    std::abs(static_cast<double>(s.scale) * s.scale_inv - 1.0) <= 1e-6;
    if (!ok && bad->empty())
      *bad = "step " + std::to_string(k) + ", slot " + slots[i].name() + " (amax " +
             std::to_string(amax) + "): dtype " + std::string(sdk::dtype_name(s.dtype)) +
             ", scale " + std::to_string(s.scale) + ", scale_inv " + std::to_string(s.scale_inv);
    out.push_back(s);
  }
  p.on_step_end(k % 3 != 1);
  return out;
}

bool same(const std::vector<sdk::OperandScaling>& a, const std::vector<sdk::OperandScaling>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].dtype != b[i].dtype ||
        std::bit_cast<std::uint32_t>(a[i].scale) != std::bit_cast<std::uint32_t>(b[i].scale) ||
        std::bit_cast<std::uint32_t>(a[i].scale_inv) !=
            std::bit_cast<std::uint32_t>(b[i].scale_inv))
      return false;
  return true;
}

sdk::BackendCapabilities cpu_capabilities(const fs::path& scratch) {
  return internal::tiny_session(TinyModel::mlp, {}, scratch).components.backend->capabilities();
}

TEST_P(PolicyConformance, ScaledOperandsGetFiniteScalesWhateverTheAmax) {
  policy_->adapt_to(cpu_capabilities(scratch_.path()));
  if (!policy_->uses_scaled_operands())
    GTEST_SKIP() << "the policy scales no operands per tensor (uses_scaled_operands() is false)";
  std::string bad;
  for (int k = 0; k < 60 && bad.empty(); ++k) drive_step(*policy_, k, &bad);
  EXPECT_TRUE(bad.empty()) << "an operand scaling that is not an fp8 dtype with a finite scale "
                              "above 0 and scale_inv its inverse: "
                           << bad;
}

// The state saved after 25 steps gives a new policy the same scales, then and for 25 more steps.
TEST_P(PolicyConformance, ASavedStateGivesANewPolicyTheSameScales) {
  const auto caps = cpu_capabilities(scratch_.path());
  policy_->adapt_to(caps);
  if (!policy_->uses_scaled_operands()) {
    // Nothing to scale: the state still round-trips without an error.
    const auto fresh = GetParam().make();
    fresh->adapt_to(caps);
    EXPECT_NO_THROW(fresh->load_state(policy_->save_state()));
    return;
  }
  std::string bad;
  for (int k = 0; k < 25; ++k) drive_step(*policy_, k, &bad);
  const sdk::ComponentState saved = policy_->save_state();
  const auto loaded = GetParam().make();
  loaded->adapt_to(caps);
  loaded->load_state(saved);
  for (int k = 25; k < 50; ++k) {
    const auto want = drive_step(*policy_, k, &bad);
    const auto got = drive_step(*loaded, k, &bad);
    ASSERT_TRUE(same(want, got)) << "step " << k << ": the loaded policy scales differently";
  }
}

INSTANTIATE_TEST_SUITE_P(policy, PolicyConformance, ::testing::ValuesIn(registered_policies()),
                         [](const auto& info) { return info.param.name; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PolicyConformance);

}  // namespace
}  // namespace mixtrain::conformance
