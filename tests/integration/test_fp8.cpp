// Integration: FP8 delayed and current scaling through the real executable — parity with
// bf16-mixed, per-slot diagnostics, bit-exact resume with FP8 state, and bad input.
#include <map>

#include "cli_test_support.h"

namespace {

using namespace mixtrain::test;
using Fp8 = CliTest;

TEST_F(Fp8, DelayedAndCurrentScalingMatchBf16MixedOnQuickstart) {
  // One thread: the comparison is between policies, not thread schedules.
  const std::string common = " --set backend.threads=1 --set run.underflow_every=100";
  auto train = [&](const std::string& policy) {
    auto d = dir_ / policy;
    auto r = run("train " + quickstart() + common + " --set precision.policy=" + policy +
                 " --run-dir " + d.string());
    EXPECT_EQ(r.exit_code, 0) << policy << ": " << r.err;
    return d;
  };
  auto bf16 = summary(train("bf16-mixed"));
  auto delayed_dir = train("fp8-delayed");
  auto delayed = summary(delayed_dir);
  auto current = summary(train("fp8-current"));
  // "Final loss" on held-out data: the last training batch's loss is one noisy sample. Two
  // policies' runs of one seed part ways after about 75 steps, as any two trajectories do: over
  // seeds 0-9, fp8-delayed's held-out loss was within -2.2 % .. +2.6 % of bf16-mixed's (session
  // 41, before and after its change to the loss's exponentials), fp8-current's within -0.5 % ..
  // +2.3 % (seeds 0-4). 4 % is above that spread; the 2 % this test had was inside it.
  const double base = bf16["eval_loss"].get<double>();
  EXPECT_NEAR(delayed["eval_loss"].get<double>(), base, 0.04 * base);
  EXPECT_NEAR(current["eval_loss"].get<double>(), base, 0.04 * base);
  EXPECT_GT(delayed["eval_accuracy"].get<double>(), 0.9);

  // Every operand of every FP8 GEMM has its own slot "<node>.<gemm>.<role>" in the diagnostics;
  // the logits node (head) computes in bf16 (core/include/mixtrain/core/precision/planning.h).
  json last;
  for (const auto& j : records(delayed_dir / "metrics.jsonl"))
    if (j.contains("fp8")) last = j["fp8"];
  ASSERT_FALSE(last.is_null());
  EXPECT_FALSE(last.contains("head.matmul.input")) << last.dump();
  for (const char* slot : {"fc1.matmul.input", "fc1.matmul.weight", "fc1.matmul.grad_output",
                           "fc2.matmul.grad_output"}) {
    ASSERT_TRUE(last.contains(slot)) << slot << " in " << last.dump();
    EXPECT_GT(last[slot]["scale"].get<double>(), 1.0) << slot;  // the history moved the scale
    EXPECT_GE(last[slot]["saturated_share"].get<double>(), 0.0);
  }
  EXPECT_EQ(last["fc2.matmul.input"]["dtype"], "fp8_e4m3");
  EXPECT_EQ(last["fc2.matmul.grad_output"]["dtype"], "fp8_e5m2");  // hybrid format
}

// Current scaling sets each cast's scale from the tensor's own amax: nothing can saturate, and the
// diagnostics must not say otherwise (amax · fp32(448 / amax) can come out a hair above 448, and
// 448 < x <= 464 rounds to 448 anyway).
TEST_F(Fp8, CurrentScalingReportsNoSaturation) {
  auto d = dir_ / "current";
  auto r = run("train " + quickstart() +
               " --set backend.threads=1 --set precision.policy=fp8-current --set run.steps=40"
               " --set run.underflow_every=1 --set run.eval_every=0 --run-dir " +
               d.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int slots = 0;
  for (const auto& j : records(d / "metrics.jsonl"))
    if (j.contains("fp8"))
      for (const auto& [slot, stats] : j["fp8"].items()) {
        ++slots;
        EXPECT_EQ(stats["saturated_share"].get<double>(), 0.0)
            << "step " << j["step"] << " " << slot << ": " << stats.dump();
      }
  EXPECT_GT(slots, 0);
}

TEST_F(Fp8, ResumeWithFp8StateIsBitExact) {
  const std::string common =
      " --set precision.policy=fp8-delayed --set precision.amax_history_len=16"
      " --set run.steps=40 --set run.log_every=1 --set run.eval_every=0"
      " --set checkpoint.every=20 --set checkpoint.keep=5";
  auto full = dir_ / "full";
  auto r = run("train " + quickstart() + common + " --run-dir " + full.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto resumed = dir_ / "resumed";
  auto r2 =
      run("train " + quickstart() + common + " --resume " +
          (full / "checkpoints" / "step-00000020.mxt").string() + " --run-dir " + resumed.string());
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  std::map<int, double> a;
  for (const auto& j : records(full / "metrics.jsonl"))
    if (j.contains("loss")) a[j["step"].get<int>()] = j["loss"].get<double>();
  int compared = 0;
  for (const auto& j : records(resumed / "metrics.jsonl"))
    if (j.contains("loss")) {
      EXPECT_EQ(j["loss"].get<double>(), a.at(j["step"].get<int>())) << "step " << j["step"];
      ++compared;
    }
  EXPECT_EQ(compared, 20);

  // Another history length loads by the documented rule and says so.
  auto other = dir_ / "other";
  auto r3 =
      run("train " + quickstart() + common + " --set precision.amax_history_len=4 --resume " +
          (full / "checkpoints" / "step-00000020.mxt").string() + " --run-dir " + other.string());
  ASSERT_EQ(r3.exit_code, 0) << r3.err;
  EXPECT_NE(r3.err.find("amax_history_len"), std::string::npos) << r3.err;
}

// A policy switched to by a resume (--set precision.policy) has heard of the steps since the
// switch only: the checkpoints of the continued run record where its state began, so they resume
// too, bit for bit (they were refused as damaged: the policy's applied-step counter is not the
// run's).
TEST_F(Fp8, ARunSwitchedToFp8ByAResumeResumesAgainBitForBit) {
  const std::string common =
      " --set run.log_every=1 --set run.eval_every=0 --set checkpoint.every=10"
      " --set checkpoint.keep=5";
  const auto before = dir_ / "before", switched = dir_ / "switched", again = dir_ / "again";
  auto r =
      run("train " + quickstart() + common + " --set run.steps=10 --run-dir " + before.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string fp8 = " --set precision.policy=fp8-delayed --set run.steps=30";
  r = run("train " + quickstart() + common + fp8 + " --resume " +
          (before / "checkpoints" / "step-00000010.mxt").string() + " --run-dir " +
          switched.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("starts from its initial state"), std::string::npos) << r.err;
  r = run("train " + quickstart() + common + fp8 + " --resume " +
          (switched / "checkpoints" / "step-00000020.mxt").string() + " --run-dir " +
          again.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<int, double> want;
  for (const auto& j : records(switched / "metrics.jsonl"))
    if (j.contains("loss")) want[j["step"].get<int>()] = j["loss"].get<double>();
  int compared = 0;
  for (const auto& j : records(again / "metrics.jsonl"))
    if (j.contains("loss")) {
      EXPECT_EQ(j["loss"].get<double>(), want.at(j["step"].get<int>())) << "step " << j["step"];
      ++compared;
    }
  EXPECT_EQ(compared, 10);
}

// A skipped step's underflow and FP8 records are written once the step's outcome is known and
// carry "skipped": true; an applied step's carry no tag.
TEST_F(Fp8, DiagnosticsOfSkippedStepsAreTagged) {
  auto r = run("train " + config("overflow-demo.toml") +
               " --set precision.policy=fp8-delayed --set precision.fp8-delayed.base=fp16-mixed"
               " --set run.underflow_every=1 --set run.log_every=1 --set run.steps=4"
               " --set run.eval_every=0 --run-dir " +
               (dir_ / "run").string());
  ASSERT_TRUE(r.exit_code == 0 || r.exit_code == 3) << r.err;
  std::map<std::int64_t, bool> skipped;
  std::vector<json> diagnostics;
  for (const auto& rec : records(dir_ / "run" / "metrics.jsonl")) {
    if (rec.contains("loss")) skipped[rec["step"].get<std::int64_t>()] = rec["skipped"].get<bool>();
    if (rec.contains("fp8") || rec.contains("underflow")) diagnostics.push_back(rec);
  }
  ASSERT_EQ(skipped.size(), 4u);
  int tagged = 0;
  for (const auto& d : diagnostics) {
    const bool was_skipped = skipped.at(d["step"].get<std::int64_t>());
    EXPECT_EQ(d.contains("skipped"), was_skipped) << d.dump();
    tagged += d.contains("skipped") ? 1 : 0;
  }
  EXPECT_GT(tagged, 0) << "the demo must skip steps for the test to mean anything";
  EXPECT_LT(tagged, static_cast<int>(diagnostics.size()));
}

TEST_F(Fp8, BadOptionsExit2WithLocation) {
  auto r = run("check " + quickstart() +
               " --set precision.policy=fp8-delayed --set precision.fp8_format=hybird");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("did you mean 'hybrid'"), std::string::npos) << r.err;
  auto r2 = run("check " + quickstart() +
                " --set precision.policy=fp8-delayed --set precision.margin=99");
  EXPECT_EQ(r2.exit_code, 2);
  EXPECT_NE(r2.err.find("precision.margin"), std::string::npos) << r2.err;
  EXPECT_NE(r2.err.find("out of range"), std::string::npos) << r2.err;
  auto r3 = run("check " + quickstart() +
                " --set precision.policy=fp8-delayed --set precision.amax_update=unfsued");
  EXPECT_EQ(r3.exit_code, 2);
  EXPECT_NE(r3.err.find("did you mean 'unfused'"), std::string::npos) << r3.err;
}

// The FP8 linears' note on the passes their backward runs apart names what the model has: a relu
// model's, not gelu's.
TEST_F(Fp8, TheNoteOnPassesOfTheirOwnNamesTheModelsActivation) {
  auto r = run("train " + quickstart() +
               " --set run.steps=1 --set run.eval_every=0 --set precision.policy=fp8-delayed"
               " --set precision.fp8-delayed.base=fp16-mixed --run-dir " +
               (dir_ / "run").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string all = r.out + r.err;
  const auto at = all.find("their backward runs ");
  ASSERT_NE(at, std::string::npos) << all;
  const std::string line = all.substr(at, all.find('\n', at) - at);
  EXPECT_TRUE(has(line, "the bias gradients and relu's gradient")) << line;
  EXPECT_FALSE(has(line, "gelu")) << line;
}

}  // namespace
