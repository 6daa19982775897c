// The optimizer's state tensors are saved by name (sdk/optimizer.h): a plugin whose slots share a
// name, or have none, is refused when the model is built, naming the optimizer, not at the first
// checkpoint steps later (whose error named no component).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "cpu_test_backend.h"
#include "distributed/local_reducer.h"
#include "mixtrain/sdk/error.h"
#include "train/planned_model.h"

namespace mixtrain::core {
namespace {

class Fp32Policy final : public sdk::PrecisionPolicy {
 public:
  sdk::OpPrecision plan(const sdk::OpDescription&) const override { return {}; }
  bool needs_loss_scaling() const override { return false; }
};

class ConstantScaler final : public sdk::LossScaler {
 public:
  float scale() const override { return 1.0f; }
  sdk::ScalerDecision update(bool) override { return {true, 1.0f, 1.0f}; }
  sdk::ComponentState save_state() const override { return {}; }
  void load_state(const sdk::ComponentState&) override {}
};

// One slot per parameter, named as `name_of` says.
class NamedSlotsOptimizer final : public sdk::Optimizer {
 public:
  explicit NamedSlotsOptimizer(std::string (*name_of)(const std::string&)) : name_of_(name_of) {}
  double base_lr() const override { return 0.1; }
  void bind(sdk::DeviceBackend&, std::span<const sdk::Parameter> params) override {
    slots_.clear();
    for (const auto& p : params) slots_.push_back({name_of_(p.name), p.tensors.grad});
  }
  void step(sdk::DeviceBackend&, std::span<const sdk::Parameter>,
            const sdk::StepContext&) override {}
  std::vector<sdk::NamedTensorView> state_tensors() const override { return slots_; }
  sdk::ComponentState save_state() const override { return {}; }
  void load_state(const sdk::ComponentState&) override {}

 private:
  std::string (*name_of_)(const std::string&);
  std::vector<sdk::NamedTensorView> slots_;
};

// The trainer's state for a two-linear MLP with `optimizer`, built.
void build_with(const std::shared_ptr<sdk::Optimizer>& optimizer) {
  Trainer::State s;
  s.e.run.underflow_every = 0;
  s.e.data.batch_size = 4;
  s.e.optimizer_type = "slots";
  s.e.model.layers = {test_support::op("linear", "fc1", {{"out", 8}}),
                      test_support::op("linear", "head", {{"out", 3}})};
  s.c.backend = test_support::cpu();
  s.c.policy = std::make_shared<Fp32Policy>();
  s.c.scaler = std::make_shared<ConstantScaler>();
  s.c.optimizer = optimizer;
  s.train.rows = 8;
  s.train.features = 5;
  s.train.classes = 3;
  s.train.x.assign(40, 0.5f);
  s.train.y = {0, 1, 2, 0, 1, 2, 0, 1};
  s.reducer = std::make_unique<LocalReducer>(s.c.backend);
  s.rank_batch = s.e.data.batch_size;
  build_model(s);
}

TEST(OptimizerSlots, EachSlotNamedApartBuilds) {
  EXPECT_NO_THROW(build_with(
      std::make_shared<NamedSlotsOptimizer>([](const std::string& p) { return p + ".momentum"; })));
}

TEST(OptimizerSlots, TwoSlotsOfOneNameAreRefusedNamingTheOptimizer) {
  try {
    build_with(std::make_shared<NamedSlotsOptimizer>(
        [](const std::string&) { return std::string("same"); }));
    ADD_FAILURE() << "expected sdk::PluginError";
  } catch (const sdk::PluginError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("optimizer 'slots' names two of its state tensors 'same'"),
              std::string::npos)
        << what;
    EXPECT_NE(e.hint().find("report it to its authors"), std::string::npos) << e.hint();
  }
  EXPECT_THROW(build_with(std::make_shared<NamedSlotsOptimizer>(
                   [](const std::string&) { return std::string(); })),
               sdk::PluginError);
}

}  // namespace
}  // namespace mixtrain::core
