// Integration: what a resume may swap, through the real executable (README, --resume). Another
// loss scaler or optimizer, like another precision policy, is a deliberate switch when the command
// line names it (--set): the new one starts from its initial state, with a warning naming both,
// and the checkpoints of the switched run resume bit for bit. Named by an edited config or a
// --merge it is refused at file:line:col with the --set that makes it deliberate. A run cannot
// change its checkpoint format on resume: the refusal says so, and its hints work as written.
#include <map>

#include "cli_test_support.h"

namespace mixtrain::test {
namespace {

const std::string kCommon =
    " --set backend.threads=1 --set run.log_every=1 --set run.eval_every=0"
    " --set checkpoint.every=10 --set checkpoint.keep=5";

std::string checkpoint(const fs::path& run, int step) {
  char name[64];
  std::snprintf(name, sizeof name, "step-%08d.mxt", step);
  return (run / "checkpoints" / name).string();
}

class ResumeSwaps : public CliTest {
 protected:
  static std::map<int, double> losses_by_step(const fs::path& run_dir) {
    std::map<int, double> out;
    for (const auto& j : records(run_dir / "metrics.jsonl"))
      if (j.contains("loss") && j.contains("step"))
        out[j["step"].get<int>()] = j["loss"].get<double>();
    return out;
  }

  // The loss_scale of a run's first logged step after `after`.
  static double first_scale_after(const fs::path& run_dir, int after) {
    for (const auto& j : records(run_dir / "metrics.jsonl"))
      if (j.contains("loss_scale") && j.contains("step") && j["step"].get<int>() > after)
        return j["loss_scale"].get<double>();
    ADD_FAILURE() << "no loss_scale after step " << after << " in " << run_dir;
    return 0.0;
  }

  // `b`'s losses equal `a`'s, bit for bit, at every step `b` logged; returns how many it logged.
  static int expect_same_losses(const fs::path& a, const fs::path& b) {
    const auto want = losses_by_step(a);
    int compared = 0;
    for (const auto& [step, loss] : losses_by_step(b)) {
      EXPECT_TRUE(want.count(step)) << "step " << step;
      if (want.count(step)) {
        EXPECT_EQ(loss, want.at(step)) << "step " << step;
      }
      ++compared;
    }
    return compared;
  }
};

// fp32 without a scaler, switched at step 10 to fp16-mixed with the dynamic scaler that its
// warning asks for (it was refused: "the scaler state was written by 'none'").
TEST_F(ResumeSwaps, AScalerNamedBySetStartsAfreshAndTheSwitchedRunResumesBitForBit) {
  const auto before = dir_ / "before", fresh = dir_ / "fresh", switched = dir_ / "switched",
             again = dir_ / "again", plain = dir_ / "plain";
  auto r =
      run("train " + quickstart() + kCommon + " --set run.steps=10 --run-dir " + before.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string fp16 =
      " --set precision.policy=fp16-mixed --set scaler.type=dynamic --set run.steps=30";
  // The policy alone: its warning names the --set that a resume accepts.
  r = run("train " + quickstart() + kCommon + " --set precision.policy=fp16-mixed" +
          " --set run.steps=11 --resume " + checkpoint(before, 10) + " --run-dir " +
          (dir_ / "policy-only").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "resume with --set scaler.type=dynamic")) << r.err;

  r = run("train " + quickstart() + kCommon + fp16 + " --resume " + checkpoint(before, 10) +
          " --run-dir " + switched.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err,
                  "was trained with loss scaler 'none'; --set scaler.type=dynamic switches "
                  "to 'dynamic', which starts from its initial state"))
      << r.err;
  EXPECT_FALSE(has(r.err, "small gradients will flush")) << r.err;
  // Its initial state: the scale a fresh run of the dynamic scaler starts at.
  r = run("train " + quickstart() + kCommon + fp16 + " --set run.steps=1 --run-dir " +
          fresh.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(first_scale_after(switched, 10), first_scale_after(fresh, 0));

  // The switched run's checkpoints record where the scaler's state began: resumed with the same
  // --set, or with the run's own config.toml (no --set: the same scaler), they continue it.
  r = run("train " + quickstart() + kCommon + fp16 + " --resume " + checkpoint(switched, 20) +
          " --run-dir " + again.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "switches to")) << r.err;
  EXPECT_EQ(expect_same_losses(switched, again), 10);
  r = run("train --resume " + checkpoint(switched, 20) + " --run-dir " + plain.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "written by")) << r.err;
  EXPECT_EQ(expect_same_losses(switched, plain), 10);
}

// Another scaler from a --merge file: refused where it was set, and each hint works as written.
TEST_F(ResumeSwaps, AScalerFromAFileIsRefusedWithTheSetThatSwitches) {
  const auto before = dir_ / "before";
  auto r =
      run("train " + quickstart() + kCommon + " --set run.steps=10 --run-dir " + before.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto merge = write_file("scaler.toml", "[scaler]\ntype = \"static\"\n");
  const std::string resume = "train " + quickstart() + kCommon + " --set run.steps=12 --merge " +
                             merge.string() + " --resume " + checkpoint(before, 10);
  r = run(resume + " --run-dir " + (dir_ / "refused").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "the scaler state was written by 'none' but this run uses 'static' (" +
                             merge.string() + ":2:"))
      << r.err;
  EXPECT_TRUE(has(r.err, "--set scaler.type=none")) << r.err;
  EXPECT_TRUE(has(r.err, "--set scaler.type=static")) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "refused" / "metrics.jsonl"));
  for (const char* type : {"static", "none"}) {
    r = run(resume + " --set scaler.type=" + type + " --run-dir " + (dir_ / type).string());
    EXPECT_EQ(r.exit_code, 0) << type << ": " << r.err;
  }
}

// adamw -> sgd with momentum: a deliberate switch (the momentum buffer is new: it was refused as
// "no optimizer state 'fc1.weight.momentum_buffer'"); its run resumes bit for bit.
TEST_F(ResumeSwaps, AnOptimizerNamedBySetStartsAfreshAndTheSwitchedRunResumesBitForBit) {
  const auto before = dir_ / "before", switched = dir_ / "switched", again = dir_ / "again";
  auto r =
      run("train " + quickstart() + kCommon + " --set run.steps=10 --run-dir " + before.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string sgd =
      " --set optimizer.type=sgd --set optimizer.sgd.momentum=0.9 --set run.steps=30";
  r = run("train " + quickstart() + kCommon + sgd + " --resume " + checkpoint(before, 10) +
          " --run-dir " + switched.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err,
                  "was trained with optimizer 'adamw'; --set optimizer.type=sgd switches to "
                  "'sgd', which starts from its initial state"))
      << r.err;
  EXPECT_EQ(summary(switched)["optimizer"], "sgd");
  r = run("train --resume " + checkpoint(switched, 20) + " --run-dir " + again.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "written by")) << r.err;
  EXPECT_EQ(expect_same_losses(switched, again), 10);

  // Named in a file, it is refused where.
  const auto merge = write_file("sgd.toml", "[optimizer]\ntype = \"sgd\"\n");
  r = run("train " + quickstart() + kCommon + " --set run.steps=12 --merge " + merge.string() +
          " --resume " + checkpoint(before, 10) + " --run-dir " + (dir_ / "refused").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "the optimizer state was written by 'adamw' but this run uses 'sgd' (" +
                             merge.string() + ":2:"))
      << r.err;
  EXPECT_TRUE(has(r.err, "--set optimizer.type=sgd")) << r.err;
}

// A native run resumed under checkpoint.format = "safetensors": refused as a format change (the
// hint was "--checkpoint FILE", which train does not take), and the hint's --set resumes it.
TEST_F(ResumeSwaps, ACheckpointFormatChangeOnResumeIsRefusedAndItsHintWorks) {
  const auto run_dir = dir_ / "run";
  auto r =
      run("train " + quickstart() + kCommon + " --set run.steps=10 --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string other = " --set run.steps=12 --set checkpoint.format=safetensors";
  for (const std::string& given : {run_dir.string(), checkpoint(run_dir, 10)}) {
    r = run("train " + quickstart() + kCommon + other + " --resume " + given);
    EXPECT_EQ(r.exit_code, 2) << given << ": " << r.err;
    EXPECT_TRUE(has(r.err, "a run cannot change its checkpoint format on resume")) << r.err;
    EXPECT_TRUE(has(r.err, "--set checkpoint.format=native")) << r.err;
    EXPECT_FALSE(has(r.err, "--checkpoint")) << r.err;
  }
  r = run("train " + quickstart() + kCommon + other + " --set checkpoint.format=native --resume " +
          run_dir.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // The other route: a new run in the new format from the checkpoint's weights.
  r = run("train " + quickstart() + kCommon + other + " --set checkpoint.init_from=" +
          checkpoint(run_dir, 10) + " --run-dir " + (dir_ / "new").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // eval takes the file by --checkpoint, as its hint says.
  r = run("eval " + quickstart() + " --set backend.threads=1 --set checkpoint.format=safetensors" +
          " --checkpoint " + run_dir.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--checkpoint " + checkpoint(run_dir, 12))) << r.err;
  r = run("eval " + quickstart() + " --set backend.threads=1 --set checkpoint.format=safetensors" +
          " --checkpoint " + checkpoint(run_dir, 12));
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A safetensors run's checkpoints hold weights only: resumed, the refusal says so and gives the
// init_from that works (a format change would not help).
TEST_F(ResumeSwaps, AWeightsOnlyCheckpointIsRefusedWithARouteThatWorks) {
  const auto run_dir = dir_ / "run";
  auto r =
      run("train " + quickstart() + kCommon +
          " --set run.steps=4 --set checkpoint.format=safetensors --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto file = run_dir / "checkpoints" / "step-00000004.safetensors";
  for (const std::string format : {"safetensors", "native"}) {
    r = run("train " + quickstart() + kCommon + " --set run.steps=6 --set checkpoint.format=" +
            format + " --resume " + file.string() + " --run-dir " + (dir_ / format).string());
    EXPECT_EQ(r.exit_code, 2) << format << ": " << r.err;
    EXPECT_TRUE(has(r.err, "kept the weights only")) << format << ": " << r.err;
    EXPECT_TRUE(has(r.err, "--set checkpoint.init_from=" + file.string())) << r.err;
  }
  r = run("train " + quickstart() + kCommon + " --set run.steps=2 --set checkpoint.init_from=" +
          file.string() + " --run-dir " + (dir_ / "new").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace mixtrain::test
