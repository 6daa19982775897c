// Automatic escalation through the Trainer, in process with the real plugins, on the shipped
// overflow demo in fp16-mixed (its input projection overflows fp16 in every forward pass):
// - the promotion fires on exactly the `after`-th blame, and every step before it is bit for bit
//   the step of the same run without escalation;
// - the promotion stands in the checkpoint: a resume after it, and a resume between two blames
//   (the count goes on), continue bit for bit as the uninterrupted run;
// - metrics.jsonl records it, and `compare` shows it;
// - a frozen node it promotes keeps its weights through the rebuild.
// Every comparison is between runs made in the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "built_plugins.h"
#include "metrics_records.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/core/runs/comparison.h"
#include "mixtrain/core/train/trainer.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

core::PluginRegistry& plugins() {
  return test::built_plugins();
}

// The demo in fp16-mixed, logging every step, short.
const std::vector<std::string> kFp16 = {"precision.policy=fp16-mixed", "run.steps=12",
                                        "run.log_every=1", "run.eval_every=0"};
const std::vector<std::string> kEscalate = {"precision.escalate.after=3",
                                            "precision.escalate.window=50"};

class Escalation : public ::testing::Test {
 protected:
  fs::path dir_ = fs::temp_directory_path() /
                  ("mixtrain-escalation-" + std::to_string(::getpid()) + "-" + folder_name());
  // A parameterized test's name holds a '/': one folder, not two.
  static std::string folder_name() {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '-');
    return name;
  }
  void SetUp() override { fs::remove_all(dir_); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  core::TrainSummary train(const std::string& name, std::vector<std::string> sets,
                           const std::string& resume = "") {
    sets.insert(sets.begin(), kFp16.begin(), kFp16.end());
    auto e = core::parse_experiment(
        core::Config::from_file(fs::path(MIXTRAIN_CONFIGS_DIR) / "overflow-demo.toml", sets),
        plugins());
    core::TrainOptions opt;
    opt.run_dir = dir_ / name;
    if (!resume.empty()) opt.resume = resume;
    return core::Trainer(e, core::create_components(e, plugins()), opt).run();
  }
  // metrics.jsonl without what measures time or the process.
  std::vector<json> metrics(const std::string& name) {
    return test::unmeasured_records(dir_ / name / "metrics.jsonl");
  }
  static std::vector<json> step_records(const std::vector<json>& all) {
    std::vector<json> out;
    for (const auto& r : all)
      if (r.contains("loss")) out.push_back(r);
    return out;
  }
  static std::vector<json> escalations(const std::vector<json>& all) {
    std::vector<json> out;
    for (const auto& r : all)
      if (r.contains("escalation")) out.push_back(r["escalation"]);
    return out;
  }
  fs::path checkpoint(const std::string& name, int step) {
    char file[64];
    std::snprintf(file, sizeof file, "step-%08d.mxt", step);
    return dir_ / name / "checkpoints" / file;
  }
};

TEST_F(Escalation, FiresOnTheThirdBlameAndLeavesEveryEarlierStepAsItWas) {
  const auto naive = train("naive", {});
  const auto escalated = train("escalated", kEscalate);
  EXPECT_EQ(naive.skipped_steps, 12)
      << "the demo must overflow in fp16 for the test to mean anything";
  EXPECT_TRUE(naive.diverged);
  EXPECT_EQ(escalated.skipped_steps, 3);
  EXPECT_FALSE(escalated.diverged);

  const auto all = metrics("escalated");
  const auto events = escalations(all);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["kind"], "promote");
  EXPECT_EQ(events[0]["step"], 3);
  EXPECT_EQ(events[0]["node"], "proj");
  EXPECT_EQ(events[0]["from"], "fp16");
  EXPECT_EQ(events[0]["to"], "fp32");
  EXPECT_EQ(events[0]["blamed_at"], json({1, 2, 3}));

  const auto a = step_records(metrics("naive")), b = step_records(all);
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(a[i], b[i]) << "step " << i + 1 << " ran before the promotion";
    EXPECT_EQ(b[i]["nonfinite"], "forward proj.output");
  }
  for (std::size_t i = 3; i < b.size(); ++i) EXPECT_FALSE(b[i]["skipped"].get<bool>()) << i + 1;
}

// Unscaled features (no forward overflow) and a dynamic scaler started far too high: the first
// steps overflow in the backward pass only because of the scale, which the scaler's back-off
// fixes. They blame no op (a promotion would cost speed and memory for nothing): the run is the
// same, step for step, as the run without escalation, though a single blame would promote. With
// hysteresis 2 the first overflow keeps the scale, spending the budget the back-off comes with:
// it blames no op either.
class EscalationUnderADynamicScale : public Escalation,
                                     public ::testing::WithParamInterface<int> {};

TEST_P(EscalationUnderADynamicScale, BackwardOverflowsTheLossScaleMadeBlameNoOp) {
  const std::vector<std::string> scaled = {
      "data.synthetic.feature_scale=1.0", "scaler.dynamic.init_scale=1e9",
      "scaler.dynamic.hysteresis=" + std::to_string(GetParam())};
  auto with_escalation = scaled;
  with_escalation.insert(with_escalation.end(),
                         {"precision.escalate.after=1", "precision.escalate.window=50"});
  const auto plain = train("plain", scaled);
  const auto escalated = train("escalated", with_escalation);
  ASSERT_GE(plain.skipped_steps, 3) << "the scale must overflow for the test to mean anything";
  EXPECT_EQ(escalated.skipped_steps, plain.skipped_steps);
  const auto all = metrics("escalated");
  EXPECT_TRUE(escalations(all).empty());
  const auto a = step_records(metrics("plain")), b = step_records(all);
  ASSERT_EQ(a.size(), 12u);
  EXPECT_EQ(a, b);
  for (const auto& r : b) {
    if (r["skipped"].get<bool>()) {
      EXPECT_EQ(r["nonfinite"].get<std::string>().rfind("backward ", 0), 0u) << r.dump();
    }
  }
}

// The same backward overflow under a static scale: the scaler only counts the skip, the overflow
// would come again at every step, and the op that made it is blamed and promoted.
TEST_F(Escalation, ABackwardOverflowUnderAStaticScaleBlamesItsNode) {
  const auto run = train("static", {"data.synthetic.feature_scale=1.0", "scaler.type=\"static\"",
                                    "scaler.static.scale=1e9", "precision.escalate.after=1",
                                    "precision.escalate.window=50"});
  const auto all = metrics("static");
  const auto events = escalations(all);
  ASSERT_FALSE(events.empty()) << "the static scale must overflow for the test to mean anything";
  EXPECT_EQ(events[0]["kind"], "promote");
  EXPECT_EQ(events[0]["step"], 1);
  const auto steps = step_records(all);
  ASSERT_FALSE(steps.empty());
  EXPECT_TRUE(steps[0]["skipped"].get<bool>());
  EXPECT_EQ(steps[0]["nonfinite"].get<std::string>().rfind("backward ", 0), 0u) << steps[0];
  EXPECT_LT(run.skipped_steps, 12);
}

// A dynamic scaler at its min_scale cannot back off either: an overflow after finite steps (whose
// growth tracker it resets) blames its node at once. Asking the scaler what more overflows would do
// leaves it, and the log, as they were: the run up to that step is the run without escalation.
TEST_F(Escalation, ABackwardOverflowUnderADynamicScaleAtItsFloorBlamesItsNode) {
  const std::vector<std::string> floor = {"data.synthetic.feature_scale=1.0",
                                          "scaler.dynamic.init_scale=1.8e7",
                                          "scaler.dynamic.min_scale=1.8e7", "run.steps=60"};
  auto with_escalation = floor;
  with_escalation.insert(with_escalation.end(),
                         {"precision.escalate.after=1", "precision.escalate.window=50"});
  train("plain", floor);
  train("floor", with_escalation);
  const auto plain = step_records(metrics("plain")), all = metrics("floor");
  int first_skip = 0;
  for (const auto& r : plain)
    if (first_skip == 0 && r["skipped"].get<bool>()) first_skip = r["step"].get<int>();
  ASSERT_GT(first_skip, 1) << "the floor must overflow after finite steps to mean anything";
  const auto events = escalations(all);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0]["step"], first_skip);
  const auto escalated = step_records(all);
  for (int i = 0; i < first_skip; ++i) EXPECT_EQ(escalated[i], plain[i]) << "step " << i + 1;
}

INSTANTIATE_TEST_SUITE_P(Hysteresis, EscalationUnderADynamicScale, ::testing::Values(1, 2),
                         [](const auto& info) {
                           return "hysteresis" + std::to_string(info.param);
                         });

TEST_F(Escalation, AResumeAfterThePromotionOrBetweenBlamesContinuesBitForBit) {
  auto sets = kEscalate;
  sets.insert(sets.end(), {"checkpoint.every=2", "checkpoint.keep=10"});
  train("full", sets);
  const auto full = metrics("full");
  // Step 2: two blames counted, the third (step 3) promotes in the resumed run too. Step 6: the
  // promotion stands in the checkpoint and plans the resumed model.
  for (int from : {2, 6}) {
    const std::string name = "resumed-" + std::to_string(from);
    train(name, sets, checkpoint("full", from).string());
    const auto resumed = metrics(name);
    std::vector<json> tail;
    for (const auto& r : full)
      if (r["step"].get<int>() > from) tail.push_back(r);
    ASSERT_EQ(resumed.size(), tail.size()) << name;
    for (std::size_t i = 0; i < tail.size(); ++i) EXPECT_EQ(resumed[i], tail[i]) << name;
  }
  // The resumed run's checkpoints hold the same masters as the uninterrupted run's.
  auto c = core::create_components(
      core::parse_experiment(
          core::Config::from_file(fs::path(MIXTRAIN_CONFIGS_DIR) / "overflow-demo.toml", kFp16),
          plugins()),
      plugins());
  const auto a = c.checkpoint_format->read(checkpoint("full", 12));
  const auto b = c.checkpoint_format->read(checkpoint("resumed-2", 12));
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_EQ(a.tensors[i].bytes, b.tensors[i].bytes) << a.tensors[i].name;
  }
  EXPECT_EQ(a.metadata.at("escalation"), b.metadata.at("escalation"));
}

// A resume under a config that now pins the promoted node (an override added since, as a merged
// calibration file adds): the config's plan stands and the node's escalation is dropped, said
// once; no later demotion claims it went back to fp16 (before, "proj back from fp32 to fp16"
// while it kept running fp32).
TEST_F(Escalation, AResumeUnderAConfigThatPinsThePromotedNodeDropsItsEscalation) {
  auto sets = kEscalate;
  sets.insert(sets.end(), {"checkpoint.every=6", "checkpoint.keep=10",
                           "precision.escalate.deescalate_after=4"});
  train("full", sets);
  ASSERT_FALSE(escalations(metrics("full")).empty());
  std::ifstream demo(fs::path(MIXTRAIN_CONFIGS_DIR) / "overflow-demo.toml");
  std::string text((std::istreambuf_iterator<char>(demo)), {});
  text += "\n[[precision.override]]\nlayers = \"proj\"\ncompute = \"fp32\"\n";
  const fs::path pinned = dir_ / "pinned.toml";
  fs::create_directories(dir_);
  std::ofstream(pinned) << text;
  sets.insert(sets.begin(), kFp16.begin(), kFp16.end());
  auto e = core::parse_experiment(core::Config::from_file(pinned, sets), plugins());
  core::TrainOptions opt;
  opt.run_dir = dir_ / "pinned";
  opt.resume = checkpoint("full", 6).string();
  ::testing::internal::CaptureStderr();  // the host's log sink writes to stderr
  core::Trainer(e, core::create_components(e, plugins()), opt).run();
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("escalation had promoted node 'proj' from fp16 to fp32, but this config "
                      "plans it fp32: the config's plan stands"),
            std::string::npos)
      << said;
  for (const auto& event : escalations(metrics("pinned")))
    EXPECT_NE(event["node"], "proj") << event.dump();
}

// A rebuilt model keeps the run's seed: its dropout masks (here LoRA's) and stochastic rounding are
// the run's, not seed 0's. Resuming after a demotion rebuilds nothing, so it continues bit for bit
// only if the uninterrupted run's rebuilds kept the seed too.
TEST_F(Escalation, ARebuiltModelDrawsTheRunsDropoutMasks) {
  const std::vector<std::string> sets = {
      "precision.escalate.after=2", "precision.escalate.window=10",
      "precision.escalate.deescalate_after=3", "model.lora.dropout=0.3",
      "model.lora.targets=[\"fc1\", \"fc2\"]", "run.steps=18", "checkpoint.every=1",
      "checkpoint.keep=20",
      // Inputs large enough to overflow on some batches only: after the demotion steps apply
      // before the next overflow (then proj is promoted again, pinned).
      "data.synthetic.feature_scale=14000"};
  train("full", sets);
  const auto full = metrics("full");
  // A demotion followed by an applied step under the demoted plan: what the masks change.
  const auto events = escalations(full);
  int demoted = 0;
  for (std::size_t i = 0; i < events.size() && demoted == 0; ++i) {
    if (events[i]["kind"] != "demote") continue;
    const int from = events[i]["step"].get<int>();
    const int until = i + 1 < events.size() ? events[i + 1]["step"].get<int>() : 1 << 30;
    for (const auto& r : step_records(full))
      if (r["step"].get<int>() > from && r["step"].get<int>() <= until && !r["skipped"].get<bool>())
        demoted = from;
  }
  ASSERT_GT(demoted, 0) << "no step applied between a demotion and the next promotion";
  train("resumed", sets, checkpoint("full", demoted).string());
  const auto resumed = metrics("resumed");
  std::vector<json> tail;
  for (const auto& r : full)
    if (r["step"].get<int>() > demoted) tail.push_back(r);
  ASSERT_EQ(resumed.size(), tail.size());
  for (std::size_t i = 0; i < tail.size(); ++i) EXPECT_EQ(resumed[i], tail[i]);
}

// A frozen node ([train] frozen) that escalation promotes is rebuilt with the weights it had: its
// fp16 copy goes through the host as FP32 and becomes its FP32 copy, exactly, and stays put.
TEST_F(Escalation, AFrozenNodeIsPromotedWithTheWeightsItHad) {
  auto sets = kEscalate;
  sets.insert(sets.end(), {"train.frozen=[\"proj\"]", "checkpoint.every=2", "checkpoint.keep=10"});
  const auto s = train("frozen", sets);
  EXPECT_EQ(s.skipped_steps, 3);
  const auto events = escalations(metrics("frozen"));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["node"], "proj");
  auto c = core::create_components(
      core::parse_experiment(
          core::Config::from_file(fs::path(MIXTRAIN_CONFIGS_DIR) / "overflow-demo.toml", kFp16),
          plugins()),
      plugins());
  const auto before = c.checkpoint_format->read(checkpoint("frozen", 2));
  const auto after = c.checkpoint_format->read(checkpoint("frozen", 12));
  for (const std::string name : {"param/proj.weight", "param/proj.bias"})
    EXPECT_EQ(before.find(name)->bytes, after.find(name)->bytes) << name;
  EXPECT_NE(before.find("param/fc1.weight")->bytes, after.find("param/fc1.weight")->bytes);
}

// eval, predict, sample and export (a Trainer that writes nothing) run a checkpoint under the plan
// it was trained with; checkpoint.init_from starts a new run from the config's plan.
TEST_F(Escalation, EvaluatingACheckpointUsesItsPromotionsAndANewRunDoesNot) {
  train("escalated", kEscalate);
  auto e = core::parse_experiment(
      core::Config::from_file(fs::path(MIXTRAIN_CONFIGS_DIR) / "overflow-demo.toml", kFp16),
      plugins());
  auto proj_activation = [](const core::Trainer& t) {
    for (const auto& l : t.model().layers())
      if (l->name() == "proj") return l->precision().activation;
    return sdk::DType::int32;
  };
  core::TrainOptions evaluate_only;
  evaluate_only.write_outputs = false;
  core::Trainer evaluator(e, core::create_components(e, plugins()), evaluate_only);
  EXPECT_EQ(proj_activation(evaluator), sdk::DType::fp16);
  evaluator.load_checkpoint(checkpoint("escalated", 12), /*weights_only=*/true);
  EXPECT_EQ(proj_activation(evaluator), sdk::DType::fp32);
  const auto result = evaluator.evaluate();
  EXPECT_TRUE(std::isfinite(result.loss)) << "in fp16 the projection overflows";

  core::TrainOptions fresh;
  fresh.run_dir = dir_ / "fine-tune";
  core::Trainer fine_tune(e, core::create_components(e, plugins()), fresh);
  fine_tune.load_checkpoint(checkpoint("escalated", 12), /*weights_only=*/true);
  EXPECT_EQ(proj_activation(fine_tune), sdk::DType::fp16);
}

TEST_F(Escalation, CompareListsEachRunsPromotions) {
  train("naive", {});
  train("escalated", kEscalate);
  const auto c = core::compare_runs(std::vector<fs::path>{dir_ / "naive", dir_ / "escalated"});
  ASSERT_EQ(c.runs.size(), 2u);
  EXPECT_TRUE(c.runs[0].escalations.empty());
  ASSERT_EQ(c.runs[1].escalations.size(), 1u);
  EXPECT_EQ(c.runs[1].escalations[0].node, "proj");
  EXPECT_EQ(c.runs[1].escalations[0].step, 3);
  for (const std::string& text : {core::comparison_text(c), core::diagnostics_text(c)})
    EXPECT_NE(text.find("proj fp16 -> fp32 at step 3"), std::string::npos) << text;
  const auto markdown = core::comparison_markdown(c);  // '>' is escaped there
  EXPECT_NE(markdown.find("proj fp16 -&gt; fp32 at step 3"), std::string::npos) << markdown;
  EXPECT_NE(core::comparison_json(c).find("\"escalations\""), std::string::npos);
}

}  // namespace
}  // namespace mixtrain
