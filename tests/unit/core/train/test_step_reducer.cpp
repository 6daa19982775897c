// The training step calls its Reducer at fixed points, in order, whatever the reducer does; the
// one-process LocalReducer changes nothing about the step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_test_backend.h"
#include "distributed/local_reducer.h"
#include "train/planned_model.h"
#include "train/step.h"

namespace mixtrain::core {
namespace {

// Every point it is called at, by name; optionally it reports a reduced loss.
class RecordingReducer final : public Reducer {
 public:
  std::vector<std::string> calls;
  std::optional<float> reduced_loss;
  SkipBlame agreed{"forward elsewhere.output", "elsewhere"};

  int rank() const override { return 0; }
  int world() const override { return 1; }
  void attach(Model&, std::vector<sdk::Parameter>&, std::vector<sdk::TensorView>&) override {
    calls.push_back("attach");
  }
  void begin_step() override { calls.push_back("begin_step"); }
  void finish_gradients() override { calls.push_back("finish_gradients"); }
  void flush_operand_amaxes(Model& model) override {
    calls.push_back("flush_operand_amaxes");
    model.flush_operand_amaxes();
  }
  void reduce_totals(StepTotals& totals, const std::function<LossValues()>& read_loss) override {
    calls.push_back("reduce_totals");
    if (reduced_loss) {
      LossValues loss = read_loss();
      loss.loss = *reduced_loss;
      totals.loss = loss;
    }
  }
  SkipBlame agree_on_blame(const SkipBlame& mine) override {
    calls.push_back("agree_on_blame");
    mine_ = mine;
    return agreed;
  }
  void after_update(Model&) override { calls.push_back("after_update"); }
  bool any_rank(bool mine) override { return mine; }
  void before_evaluation(Model&) override { calls.push_back("before_evaluation"); }
  void agree_on_evaluation(EvalResult&) override { calls.push_back("agree_on_evaluation"); }
  std::vector<StagedTensor> optimizer_state(const sdk::Optimizer&) override { return {}; }
  std::vector<StagedTensor> optimizer_state_for_save(const sdk::Optimizer&) override { return {}; }
  void serve_save_reads(const sdk::Optimizer&) override {}
  void end_save_reads() override {}
  void load_optimizer_state(const sdk::Optimizer&, const WholeTensorFinder&,
                            const WholeTensorLoader&, const std::string&) override {}
  void announce(sdk::Logger&, std::int64_t) override {}
  void report_step(nlohmann::json&) override {}
  void report_run(TrainSummary&, const sdk::Optimizer&,
                  const std::function<std::vector<std::byte>()>&, sdk::Logger&) override {}
  const SkipBlame& mine() const { return mine_; }

 protected:
  void set_communicating(bool on) override { calls.push_back(on ? "communicating" : "local_only"); }

 private:
  SkipBlame mine_;
};

class Fp32Policy final : public sdk::PrecisionPolicy {
 public:
  sdk::OpPrecision plan(const sdk::OpDescription&) const override { return {}; }
  bool needs_loss_scaling() const override { return false; }
};

// A constant scale; each update answers what `skip` says, whatever the gradients hold.
class ScriptedScaler final : public sdk::LossScaler {
 public:
  bool skip = false;
  float scale() const override { return 1.0f; }
  sdk::ScalerDecision update(bool) override { return {!skip, 1.0f, 1.0f}; }
  sdk::ComponentState save_state() const override { return {}; }
  void load_state(const sdk::ComponentState&) override {}
};

class CountingOptimizer final : public sdk::Optimizer {
 public:
  int steps = 0;
  double base_lr() const override { return 0.1; }
  void bind(sdk::DeviceBackend&, std::span<const sdk::Parameter>) override {}
  void step(sdk::DeviceBackend&, std::span<const sdk::Parameter>,
            const sdk::StepContext&) override {
    ++steps;
  }
  std::vector<sdk::NamedTensorView> state_tensors() const override { return {}; }
  sdk::ComponentState save_state() const override { return {}; }
  void load_state(const sdk::ComponentState&) override {}
};

// A two-layer MLP over a small table, built as the trainer builds it, with `reducer`.
struct StepFixture {
  Trainer::State s;
  std::shared_ptr<ScriptedScaler> scaler = std::make_shared<ScriptedScaler>();
  std::shared_ptr<CountingOptimizer> optimizer = std::make_shared<CountingOptimizer>();

  explicit StepFixture(std::unique_ptr<Reducer> reducer) {
    s.e.run.underflow_every = 0;
    s.e.data.batch_size = 4;
    s.e.model.layers = {test_support::op("linear", "fc1", {{"out", 8}}),
                        test_support::op("relu", "act"),
                        test_support::op("linear", "head", {{"out", 3}})};
    s.c.backend = test_support::cpu();
    s.c.policy = std::make_shared<Fp32Policy>();
    s.c.scaler = scaler;
    s.c.optimizer = optimizer;
    s.train.rows = 8;
    s.train.features = 5;
    s.train.classes = 3;
    for (int i = 0; i < 40; ++i) s.train.x.push_back(static_cast<float>(i % 7) * 0.1f);
    s.train.y = {0, 1, 2, 0, 1, 2, 0, 1};
    s.reducer = std::move(reducer);
    s.rank_batch = s.e.data.batch_size;
    build_model(s);
    s.model->init_parameters(1);
    s.data.sampler = std::make_unique<BatchSampler>(s.train.rows, s.e.data.batch_size, false, 1);
    s.data.host.x.resize(static_cast<std::size_t>(s.model->max_rows() * s.train.features));
    s.data.host.y.resize(static_cast<std::size_t>(s.model->max_rows()));
  }

  StepOutcome step(const StepRequest& request = {}) {
    ++s.position.step;
    return run_training_step(s, request);
  }
};

TEST(StepReducer, AnAppliedStepCallsThePointsInOrder) {
  auto owned = std::make_unique<RecordingReducer>();
  auto& r = *owned;
  StepFixture f(std::move(owned));
  EXPECT_EQ(r.calls, std::vector<std::string>{"attach"});
  r.calls.clear();
  const StepOutcome out = f.step();
  EXPECT_TRUE(out.decision.apply_step);
  EXPECT_EQ(r.calls, (std::vector<std::string>{"begin_step", "finish_gradients", "reduce_totals",
                                               "after_update"}));
  EXPECT_EQ(f.optimizer->steps, 1);
  EXPECT_EQ(f.s.position.applied, 1);
}

TEST(StepReducer, ASkippedStepReplaysLocallyThenAgreesOnTheBlame) {
  auto owned = std::make_unique<RecordingReducer>();
  auto& r = *owned;
  StepFixture f(std::move(owned));
  r.calls.clear();
  f.scaler->skip = true;
  const StepOutcome out = f.step();
  EXPECT_FALSE(out.decision.apply_step);
  EXPECT_EQ(r.calls, (std::vector<std::string>{"begin_step", "finish_gradients", "reduce_totals",
                                               "local_only", "communicating", "agree_on_blame"}));
  // The gradients are finite: this replica found nothing; the step reports the agreed blame.
  EXPECT_FALSE(r.mine().found());
  EXPECT_EQ(out.blame, r.agreed);
  EXPECT_EQ(f.optimizer->steps, 0);
  EXPECT_EQ(f.s.position.skipped, 1);
}

TEST(StepReducer, ALossTheReductionReadIsTheStepsLoss) {
  auto owned = std::make_unique<RecordingReducer>();
  owned->reduced_loss = 42.5f;
  StepFixture f(std::move(owned));
  const StepOutcome out = f.step();  // read_loss not asked: the reduction's loss is reported
  EXPECT_EQ(out.loss.loss, 42.5f);
  EXPECT_EQ(f.s.metrics.last_loss, 42.5f);
}

TEST(StepReducer, WithoutAReductionTheLossIsReadOnlyWhenAsked) {
  StepFixture f(std::make_unique<RecordingReducer>());
  f.s.metrics.last_loss = -1.0f;
  EXPECT_EQ(f.step().loss.loss, -1.0f);  // not asked: the last value read
  StepRequest read;
  read.read_loss = true;
  const float loss = f.step(read).loss.loss;
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_GT(loss, 0.0f);
  EXPECT_EQ(f.s.metrics.last_loss, loss);
}

TEST(LocalReducer, LeavesTheStepAsItIsAndCommunicatesNothing) {
  StepFixture f(std::make_unique<LocalReducer>(test_support::cpu()));
  auto& r = *f.s.reducer;
  EXPECT_EQ(r.rank(), 0);
  EXPECT_EQ(r.world(), 1);
  EXPECT_TRUE(r.leads());
  // attach() bound nothing else: the optimizer sees the model's own gradients, and no hook is
  // installed (a hook would keep the step from being recorded as a step graph).
  const auto params = f.s.model->parameters();
  ASSERT_EQ(f.s.grads.size(), params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(f.s.grads[i].data, params[i]->grad.view().data);
    EXPECT_EQ(f.s.params[i].tensors.grad.data, params[i]->grad.view().data);
  }
  EXPECT_FALSE(f.s.model->has_gradient_ready_hook());
  // The host reductions read no loss and change no total.
  StepTotals totals;
  totals.found_inf = true;
  totals.sum_squares = 2.5;
  bool read = false;
  r.reduce_totals(totals, [&] {
    read = true;
    return LossValues{};
  });
  EXPECT_FALSE(read);
  EXPECT_TRUE(totals.found_inf);
  EXPECT_EQ(totals.sum_squares, 2.5);
  EXPECT_FALSE(totals.loss.has_value());
  const SkipBlame mine{"loss", ""};
  EXPECT_EQ(r.agree_on_blame(mine), mine);
  EXPECT_TRUE(r.any_rank(true));
  EXPECT_FALSE(r.any_rank(false));
  { const auto alone = r.local_only(); }
  // A whole step trains as without a reducer: applied, the optimizer called once.
  const StepOutcome out = f.step();
  EXPECT_TRUE(out.decision.apply_step);
  EXPECT_EQ(f.optimizer->steps, 1);
}

// An optimizer holding one slot, "fc1.weight.m" fp32 [3].
class OneSlotOptimizer final : public sdk::Optimizer {
 public:
  Tensor slot{test_support::cpu(), sdk::DType::fp32, sdk::Shape{3}};
  double base_lr() const override { return 0.1; }
  void bind(sdk::DeviceBackend&, std::span<const sdk::Parameter>) override {}
  void step(sdk::DeviceBackend&, std::span<const sdk::Parameter>,
            const sdk::StepContext&) override {}
  std::vector<sdk::NamedTensorView> state_tensors() const override {
    return {{"fc1.weight.m", slot.view()}};
  }
  sdk::ComponentState save_state() const override { return {}; }
  void load_state(const sdk::ComponentState&) override {}
};

TEST(LocalReducer, OptimizerStateIsTheOptimizersOwnSlotsWhole) {
  LocalReducer r(test_support::cpu());
  OneSlotOptimizer optimizer;
  test_support::write(optimizer.slot.view(), {1.0f, 2.0f, 3.0f});
  const auto state = materialise({r.optimizer_state(optimizer), {}}).tensors;
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].name, "fc1.weight.m");
  EXPECT_EQ(state[0].shape, (std::vector<std::int64_t>{3}));
  ASSERT_EQ(state[0].bytes.size(), 12u);
  float values[3];
  std::memcpy(values, state[0].bytes.data(), sizeof values);
  EXPECT_EQ(values[2], 3.0f);

  // Back in: the loader gets the whole tensor for the whole slot.
  std::vector<std::string> asked;
  int loaded = 0;
  r.load_optimizer_state(
      optimizer,
      [&](const std::string& name) {
        asked.push_back(name);
        return &state[0];
      },
      [&](const sdk::HostTensor& whole, sdk::TensorView slot) {
        EXPECT_EQ(&whole, &state[0]);
        EXPECT_EQ(slot.data, optimizer.slot.view().data);
        ++loaded;
      },
      "file.mxt");
  EXPECT_EQ(asked, std::vector<std::string>{"fc1.weight.m"});
  EXPECT_EQ(loaded, 1);

  // A slot the file lacks is a CheckpointError naming the file and the slot.
  try {
    r.load_optimizer_state(
        optimizer, [](const std::string&) { return nullptr; },
        [](const sdk::HostTensor&, sdk::TensorView) { FAIL() << "nothing to load"; }, "file.mxt");
    FAIL() << "expected a CheckpointError";
  } catch (const sdk::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("file.mxt: no optimizer state 'fc1.weight.m'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mixtrain::core
