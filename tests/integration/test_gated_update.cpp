// The gated update (docs/architecture.md, "One training step") against the step that waits for
// its gradient check before updating: the same run, with the backend's gated kernels offered and
// denied, gives the same bits (every tensor and scalar of the final checkpoint, every metrics
// record), through skipped steps, scale growth, clipping, SGD's first-step momentum and AdamW's
// bias correction, and a scaler that skips finite steps. Both runs are made in the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "built_plugins.h"
#include "forwarding_backend.h"
#include "logging_optimizer_facet.h"
#include "metrics_records.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/train/trainer.h"
#include "mixtrain/sdk/loss_scaler.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;

const char* kBase = R"(
[run]
seed = 3
steps = 10
log_every = 1

[backend]
type = "cpu"

[precision]
policy = "fp16-mixed"

[scaler]
type = "dynamic"

[optimizer]
type = "sgd"
lr = 0.2
clip_grad_norm = 0.5

[checkpoint]
every = 10

[data]
source = "synthetic"
batch_size = 32

[data.synthetic]
kind = "clusters"
rows = 512
features = 12
num_classes = 4

[model]
layers = [ { type = "linear", out = 16 }, { type = "gelu" }, { type = "linear", out = 4 } ]
)";

// The CPU backend with its optimizer facet logged, and the gated kernels offered or denied.
class GateSwitchBackend final : public test::ForwardingBackend {
 public:
  GateSwitchBackend(std::shared_ptr<sdk::DeviceBackend> in, bool gated)
      : ForwardingBackend(std::move(in)),
        optimizer_(sdk::facet<sdk::OptimizerFacet>(*in_), calls, gated) {}
  sdk::Facet* find_facet(std::string_view name) override {
    if (name == sdk::OptimizerFacet::kName) return &optimizer_;
    return in_->find_facet(name);
  }
  std::vector<std::string> calls;

 private:
  test::LoggingOptimizerFacet optimizer_;
};

// Applies every step but each third, whatever the gradients say, at a fixed scale: the gated
// step asks it first what it decides for finite gradients, and must not queue the update of a
// step it skips.
class EveryThirdSkipped final : public sdk::LossScaler {
 public:
  float scale() const override { return 1.0f; }
  sdk::ScalerDecision update(bool found_inf) override {
    ++steps_;
    return {!found_inf && steps_ % 3 != 0, 1.0f, 1.0f};
  }
  sdk::ComponentState save_state() const override {
    sdk::ComponentState s;
    s.values["steps"] = steps_;
    return s;
  }
  void load_state(const sdk::ComponentState& s) override { steps_ = s.get<std::int64_t>("steps"); }

 private:
  std::int64_t steps_ = 0;
};

struct TrainedRun {
  core::TrainSummary summary;
  std::vector<std::string> calls;
  std::vector<std::string> metrics;  // without timings and memory
  sdk::TrainingState checkpoint;     // the last step's
};

class GatedUpdate : public ::testing::Test {
 protected:
  fs::path dir_ =
      fs::temp_directory_path() / ("mixtrain-gated-update-" + std::to_string(::getpid()) + "-" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  void SetUp() override { fs::remove_all(dir_); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  TrainedRun train(const std::vector<std::string>& sets, bool gated, bool third_skipped = false) {
    auto config = core::Config::from_string(kBase, "gated.toml", sets);
    auto e = core::parse_experiment(config, test::built_plugins());
    auto c = core::create_components(e, test::built_plugins());
    auto backend = std::make_shared<GateSwitchBackend>(c.backend, gated);
    c.backend = backend;
    if (third_skipped) c.scaler = std::make_shared<EveryThirdSkipped>();
    auto format = c.checkpoint_format;
    core::TrainOptions opt;
    opt.run_dir = dir_ / (gated ? "gated" : "waited");
    TrainedRun r;
    r.summary = core::Trainer(e, std::move(c), opt).run();
    r.calls = backend->calls;
    for (const auto& record : test::unmeasured_records(opt.run_dir / "metrics.jsonl"))
      r.metrics.push_back(record.dump());
    r.checkpoint =
        format->read(opt.run_dir / "checkpoints" / ("step-00000010" + format->file_extension()));
    return r;
  }

  static int count(const std::vector<std::string>& calls, const std::string& what) {
    return static_cast<int>(std::count(calls.begin(), calls.end(), what));
  }

  static void expect_same(const TrainedRun& gated, const TrainedRun& waited) {
    EXPECT_GT(count(gated.calls, "gated update"), 0) << "the gated run never gated";
    EXPECT_EQ(count(waited.calls, "gated update"), 0);
    EXPECT_EQ(gated.summary.applied_steps, waited.summary.applied_steps);
    EXPECT_EQ(gated.summary.skipped_steps, waited.summary.skipped_steps);
    EXPECT_EQ(gated.summary.final_loss_scale, waited.summary.final_loss_scale);
    EXPECT_EQ(gated.metrics, waited.metrics);
    ASSERT_EQ(gated.checkpoint.tensors.size(), waited.checkpoint.tensors.size());
    for (std::size_t i = 0; i < gated.checkpoint.tensors.size(); ++i) {
      const auto& a = gated.checkpoint.tensors[i];
      const auto& b = waited.checkpoint.tensors[i];
      EXPECT_EQ(a.name, b.name);
      EXPECT_TRUE(a.bytes == b.bytes) << a.name << " differs";
    }
    // The component states (the optimizer's applied-step count, the scaler's) and the position.
    EXPECT_EQ(gated.checkpoint.metadata, waited.checkpoint.metadata);
  }
};

// 2^25 overflows the fp16 gradients at once: the scaler backs off through skips, then grows every
// second finite step until it overflows again, so the run holds both kinds of step and scale
// changes both ways.
const std::vector<std::string> kOverflowing = {"scaler.init_scale=33554432",
                                               "scaler.growth_interval=2"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_F(GatedUpdate, SgdWithMomentumClippingAndSkippedStepsGivesTheSameBits) {
  const auto sets = with(kOverflowing, {"optimizer.momentum=0.9"});
  const TrainedRun gated = train(sets, true), waited = train(sets, false);
  // The first applied step is not step 1, which SGD's first-step momentum must notice.
  ASSERT_GT(gated.summary.skipped_steps, 0);
  ASSERT_GT(gated.summary.applied_steps, 2);
  expect_same(gated, waited);
}

TEST_F(GatedUpdate, AdamWGivesTheSameBits) {
  const auto sets = with(kOverflowing, {"optimizer.type=adamw", "optimizer.lr=0.01"});
  const TrainedRun gated = train(sets, true), waited = train(sets, false);
  ASSERT_GT(gated.summary.skipped_steps, 0);
  expect_same(gated, waited);
}

TEST_F(GatedUpdate, AStepTheScalerSkipsDespiteFiniteGradientsIsNeverQueued) {
  const std::vector<std::string> sets = {"precision.policy=fp32", "scaler.type=none"};
  const TrainedRun gated = train(sets, true, true), waited = train(sets, false, true);
  EXPECT_EQ(gated.summary.skipped_steps, 3);
  expect_same(gated, waited);
}

}  // namespace
}  // namespace mixtrain
