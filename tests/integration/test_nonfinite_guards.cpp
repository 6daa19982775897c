// What a run does when its weights or a plugin's answers are not finite (docs/architecture.md,
// "Errors and data safety"): a scaler that applies a step whose gradients are not finite, or
// gives a loss scale that is not a number above 0; weights an update made non-finite, which stop
// the run at the next skipped step without a checkpoint of them, so that checkpoint.keep never
// rotates out the good ones; a checkpoint of such weights refused at the save that would write it;
// and a run refused at the start from a file that holds them, or whose tensor's bytes do not fit
// its shape. Each case trains a small MLP on the CPU for a few steps.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "built_plugins.h"
#include "mixtrain/core/checkpoint/path.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/core/train/trainer.h"
#include "mixtrain/sdk/checkpoint_format.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/loss_scaler.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;

const char* kBase = R"(
[run]
seed = 5
steps = 12
log_every = 1

[backend]
type = "cpu"

[precision]
policy = "fp32"

[scaler]
type = "none"

[optimizer]
type = "sgd"
lr = 0.1

[checkpoint]
every = 2
keep = 2

[data]
source = "synthetic"
batch_size = 16

[data.synthetic]
kind = "clusters"
rows = 256
features = 8
num_classes = 3

[model]
layers = [ { type = "linear", out = 12 }, { type = "relu" }, { type = "linear", out = 3 } ]
)";

// A scaler that applies every step whatever the gradients say, at a scale of its own.
class AppliesEverything final : public sdk::LossScaler {
 public:
  explicit AppliesEverything(float scale) : scale_(scale) {}
  float scale() const override { return scale_; }
  sdk::ScalerDecision update(bool /*found_inf*/) override { return {true, scale_, scale_}; }
  sdk::ComponentState save_state() const override { return {}; }
  void load_state(const sdk::ComponentState& /*state*/) override {}

 private:
  float scale_;
};

// The native format, with what it reads changed by `edit`.
class EditedReads final : public sdk::CheckpointFormat {
 public:
  EditedReads(std::shared_ptr<sdk::CheckpointFormat> in,
              std::function<void(sdk::TrainingState&)> edit)
      : in_(std::move(in)), edit_(std::move(edit)) {}
  std::string file_extension() const override { return in_->file_extension(); }
  void write(const fs::path& path, const sdk::TrainingState& state) const override {
    in_->write(path, state);
  }
  sdk::TrainingState read(const fs::path& path) const override {
    sdk::TrainingState st = in_->read(path);
    edit_(st);
    return st;
  }

 private:
  std::shared_ptr<sdk::CheckpointFormat> in_;
  std::function<void(sdk::TrainingState&)> edit_;
};

bool all_finite(const sdk::HostTensor& t) {
  if (t.dtype != sdk::DType::fp32) return true;
  for (std::size_t i = 0; i < t.bytes.size() / 4; ++i) {
    float v;
    std::memcpy(&v, t.bytes.data() + 4 * i, 4);
    if (!std::isfinite(v)) return false;
  }
  return true;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class NonfiniteGuards : public ::testing::Test {
 protected:
  fs::path dir_ =
      fs::temp_directory_path() / ("mixtrain-nonfinite-" + std::to_string(::getpid()) + "-" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  void SetUp() override { fs::remove_all(dir_); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  core::Experiment experiment(const std::vector<std::string>& sets = {}) {
    return core::parse_experiment(core::Config::from_string(kBase, "guards.toml", sets),
                                  test::built_plugins());
  }
  core::Components components(const core::Experiment& e) {
    return core::create_components(e, test::built_plugins());
  }

  // The step checkpoints the run folder holds, by file name.
  std::vector<std::string> checkpoints(const fs::path& run, const std::string& extension = ".mxt") {
    std::vector<std::string> names;
    for (const auto& f : core::step_checkpoints(run / "checkpoints", extension))
      names.push_back(f.filename().string());
    return names;
  }

  // A run whose first parameter's master is filled with NaN right after step `poison_at`'s
  // update (before that step's checkpoint, when it has one).
  core::TrainSummary poisoned_run(const fs::path& run, std::int64_t poison_at,
                                  const std::vector<std::string>& sets = {}) {
    const auto e = experiment(sets);
    auto c = components(e);
    const auto backend = c.backend;
    core::TrainOptions opt;
    opt.run_dir = run;
    core::Trainer* trainer = nullptr;
    opt.after_step = [&](std::int64_t step) {
      if (step != poison_at) return;
      backend->fill(trainer->model().parameters().front()->master.view(),
                    std::numeric_limits<float>::quiet_NaN());
    };
    core::Trainer t(e, std::move(c), opt);
    trainer = &t;
    return t.run();
  }
};

// fp16 gradients overflow at a scale of 2^30 on every step; the scaler applies them all the same.
// The host skips each one (and says so once), so the weights stay finite and the run reports
// what it is: every step skipped.
TEST_F(NonfiniteGuards, AStepWithNonFiniteGradientsIsNeverAppliedWhateverTheScalerSays) {
  const auto e = experiment({"precision.policy=fp16-mixed", "run.steps=4"});
  auto c = components(e);
  c.scaler = std::make_shared<AppliesEverything>(1073741824.0f);
  core::TrainOptions opt;
  opt.run_dir = dir_ / "applies";
  ::testing::internal::CaptureStderr();
  const core::TrainSummary sum = core::Trainer(e, std::move(c), opt).run();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(sum.applied_steps, 0);
  EXPECT_EQ(sum.skipped_steps, 4);
  EXPECT_TRUE(sum.diverged);
  EXPECT_TRUE(has(sum.divergence, "every one of the 4 steps was skipped")) << sum.divergence;
  const std::string said = "applied step 1, whose gradients are not finite";
  EXPECT_TRUE(has(log, said)) << log;
  EXPECT_EQ(log.find(said), log.rfind(said)) << "said more than once: " << log;
  const auto format = components(e).checkpoint_format;
  const auto st = format->read(opt.run_dir / "checkpoints" / "step-00000004.mxt");
  for (const auto& t : st.tensors) EXPECT_TRUE(all_finite(t)) << t.name;
}

TEST_F(NonfiniteGuards, ALossScaleThatIsNotANumberAboveZeroIsTheScalersError) {
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), 0.0f, -1.0f,
                          std::numeric_limits<float>::infinity()}) {
    const auto e = experiment({"run.steps=2"});
    auto c = components(e);
    c.scaler = std::make_shared<AppliesEverything>(bad);
    core::TrainOptions opt;
    opt.run_dir = dir_ / ("scale-" + std::to_string(bad));
    try {
      core::Trainer(e, std::move(c), opt).run();
      ADD_FAILURE() << "a loss scale of " << bad << " trained";
    } catch (const sdk::PluginError& err) {
      EXPECT_TRUE(has(err.what(), "scaler 'none' gave a loss scale of")) << err.what();
      EXPECT_TRUE(has(err.hint(), "finite number above 0")) << err.hint();
    }
  }
}

// Weights made NaN after step 7's update: step 8 skips, finds them, and the run stops there. The
// checkpoints of steps 4 and 6 (keep = 2) stay, with finite weights; none is written of step 8.
TEST_F(NonfiniteGuards, NonFiniteWeightsStopTheRunAndKeepTheGoodCheckpoints) {
  const fs::path run = dir_ / "poisoned";
  const core::TrainSummary sum = poisoned_run(run, 7);
  EXPECT_EQ(sum.steps, 8);
  EXPECT_EQ(sum.skipped_steps, 1);
  EXPECT_TRUE(sum.diverged);
  EXPECT_TRUE(has(sum.divergence, "the weights are not finite at step 8 (first: "))
      << sum.divergence;
  EXPECT_TRUE(has(sum.divergence_remedy, "step-00000006.mxt")) << sum.divergence_remedy;
  EXPECT_TRUE(has(sum.divergence_remedy, "--resume " + run.string())) << sum.divergence_remedy;
  EXPECT_EQ(checkpoints(run), (std::vector<std::string>{"step-00000004.mxt", "step-00000006.mxt"}));
  const auto format = components(experiment()).checkpoint_format;
  for (const auto& name : checkpoints(run))
    for (const auto& t : format->read(run / "checkpoints" / name).tensors)
      EXPECT_TRUE(all_finite(t)) << name << " " << t.name;
}

// The last step alone overflows: its first layer's weights (master and fp16 copy) made 30000,
// finite but past what fp16 sums without overflow, after step 5's update. Step 6 is skipped, which
// is a transient, not a divergence (3 in a row make one), and the summary adds the last finite
// loss, step 5's.
TEST_F(NonfiniteGuards, ASkippedLastStepLeavesTheLastFiniteLossInTheSummary) {
  const auto e = experiment(
      {"precision.policy=fp16-mixed", "scaler.type=dynamic", "run.steps=6", "checkpoint.every=0"});
  auto c = components(e);
  const auto backend = c.backend;
  core::TrainOptions opt;
  opt.run_dir = dir_ / "last-skipped";
  core::Trainer* trainer = nullptr;
  opt.after_step = [&](std::int64_t step) {
    if (step != 5) return;
    auto& first = *trainer->model().parameters().front();
    backend->fill(first.master.view(), 30000.0f);
    if (!first.working.empty()) backend->fill(first.working.view(), 30000.0f);  // the fp16 copy
  };
  core::Trainer t(e, std::move(c), opt);
  trainer = &t;
  ::testing::internal::CaptureStderr();
  const core::TrainSummary sum = t.run();
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(sum.steps, 6);
  EXPECT_EQ(sum.skipped_steps, 1);
  EXPECT_FALSE(sum.diverged) << sum.divergence;
  EXPECT_FALSE(std::isfinite(sum.final_loss));
  ASSERT_TRUE(sum.last_finite_loss.has_value());
  EXPECT_TRUE(std::isfinite(*sum.last_finite_loss));
  EXPECT_GT(*sum.last_finite_loss, 0.0);
  EXPECT_EQ(sum.last_finite_loss_step, 5);
  const nlohmann::json written = nlohmann::json::parse(std::ifstream(opt.run_dir / "summary.json"));
  EXPECT_EQ(written.at("last_finite_loss_step"), 5);
  EXPECT_DOUBLE_EQ(written.at("last_finite_loss").get<double>(), *sum.last_finite_loss);

  // A healthy run's summary has none: its final loss is finite.
  const auto healthy = experiment({"run.steps=3", "checkpoint.every=0"});
  opt.after_step = nullptr;
  opt.run_dir = dir_ / "healthy";
  ::testing::internal::CaptureStderr();
  const core::TrainSummary fine = core::Trainer(healthy, components(healthy), opt).run();
  ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(std::isfinite(fine.final_loss));
  EXPECT_FALSE(fine.last_finite_loss.has_value());
}

// Weights made NaN just before step 6's checkpoint: that save refuses to write them, so the files
// of steps 2 and 4 stay.
TEST_F(NonfiniteGuards, ACheckpointOfNonFiniteWeightsIsNeverWritten) {
  const fs::path run = dir_ / "at-save";
  try {
    poisoned_run(run, 6);
    ADD_FAILURE() << "the run wrote or went past the checkpoint of step 6";
  } catch (const sdk::CheckpointError& err) {
    EXPECT_TRUE(has(err.what(), "not writing ")) << err.what();
    EXPECT_TRUE(has(err.what(), "holds nan at element 0")) << err.what();
    EXPECT_TRUE(has(err.hint(), "step-00000004.mxt")) << err.hint();
  }
  EXPECT_EQ(checkpoints(run), (std::vector<std::string>{"step-00000002.mxt", "step-00000004.mxt"}));
}

// The same through a format that writes each weight as it reads it (safetensors streams in one
// pass, where the native format reads every tensor for its checksums before it writes): the
// refusal comes partway through the file, which is then not written, and nothing is left beside.
TEST_F(NonfiniteGuards, ACheckpointStreamedPartwayIsNotWrittenEither) {
  const fs::path run = dir_ / "streamed";
  try {
    poisoned_run(run, 6, {"checkpoint.format=safetensors"});
    ADD_FAILURE() << "the run wrote or went past the checkpoint of step 6";
  } catch (const sdk::CheckpointError& err) {
    EXPECT_TRUE(has(err.what(), "not writing ")) << err.what();
    EXPECT_TRUE(has(err.what(), "holds nan at element 0")) << err.what();
  }
  std::vector<std::string> files;
  for (const auto& f : fs::directory_iterator(run / "checkpoints"))
    files.push_back(f.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files,
            (std::vector<std::string>{"step-00000002.safetensors", "step-00000004.safetensors"}));
}

// A file holding a NaN weight: a run refuses to start from it (init_from) or continue it (resume),
// naming the tensor; and a tensor whose bytes do not fit its dtype and shape is the file's fault.
TEST_F(NonfiniteGuards, ARunRefusesWeightsThatAreNotFiniteOrBytesThatDoNotFitTheirShape) {
  const auto e = experiment({"run.steps=2"});
  core::TrainOptions opt;
  opt.run_dir = dir_ / "source";
  core::Trainer(e, components(e), opt).run();
  const fs::path good = opt.run_dir / "checkpoints" / "step-00000002.mxt";
  const auto format = components(e).checkpoint_format;
  sdk::TrainingState st = format->read(good);
  std::string poisoned_name;
  for (auto& t : st.tensors)
    if (t.name.starts_with("param/") && t.dtype == sdk::DType::fp32) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(t.bytes.data() + 4, &nan, 4);
      poisoned_name = t.name;
      break;
    }
  ASSERT_FALSE(poisoned_name.empty());
  const fs::path bad = dir_ / "nan-weights.mxt";
  format->write(bad, st);

  const auto refused = [&](const core::Experiment& ex, core::TrainOptions o) {
    try {
      core::Trainer(ex, components(ex), o);
      return std::string("no error");
    } catch (const sdk::CheckpointError& err) {
      return std::string(err.what());
    }
  };
  core::TrainOptions fresh;
  fresh.run_dir = dir_ / "from-nan";
  std::string what = refused(experiment({"checkpoint.init_from=" + bad.string()}), fresh);
  EXPECT_TRUE(has(what, "tensor '" + poisoned_name + "' holds nan at element 1")) << what;
  core::TrainOptions resumed;
  resumed.run_dir = dir_ / "resumed";
  resumed.resume = bad;
  what = refused(e, resumed);
  EXPECT_TRUE(has(what, "holds nan at element 1")) << what;

  // The good file read by a format that loses a parameter's last 4 bytes, or the optimizer state.
  auto short_bytes = components(e);
  short_bytes.checkpoint_format =
      std::make_shared<EditedReads>(short_bytes.checkpoint_format, [](sdk::TrainingState& s) {
        for (auto& t : s.tensors)
          if (t.name.starts_with("param/")) {
            t.bytes.resize(t.bytes.size() - 4);
            return;
          }
      });
  resumed.run_dir = dir_ / "short";
  resumed.resume = good;
  try {
    core::Trainer(e, std::move(short_bytes), resumed);
    ADD_FAILURE() << "a tensor short of 4 bytes loaded";
  } catch (const sdk::CheckpointError& err) {
    EXPECT_TRUE(has(err.what(), "bytes, but the file gave")) << err.what();
    EXPECT_FALSE(has(err.what(), "but the model expects")) << err.what();
    EXPECT_TRUE(has(err.hint(), "checkpoint format")) << err.hint();
  }
}

}  // namespace
}  // namespace mixtrain
