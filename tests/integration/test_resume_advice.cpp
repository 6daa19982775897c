// What a resume with changed settings says, and that its advice works when followed literally:
// each warning of a change names it and ends with the --set flags that keep the old values (the
// run folder's config.toml holds the new ones by then), a continuation it abandons keeps the
// config.toml it trained with, and each refusal names what differs and a way on that resumes.
#include <string>
#include <vector>

#include "cli_test_support.h"

namespace {

using namespace mixtrain::test;
using ResumeAdvice = CliTest;

const std::string kCommon =
    " --set run.steps=20 --set run.log_every=1 --set run.eval_every=0 --set checkpoint.every=10"
    " --set checkpoint.keep=5";

// The flags each "To keep the old …, resume with --set …" of `err` offers, in order.
std::string offered_flags(const std::string& err) {
  std::string flags;
  const std::string lead = ", resume with ";
  for (auto at = err.find(lead); at != std::string::npos; at = err.find(lead, at + 1)) {
    const auto from = at + lead.size();
    const auto end = err.find('\n', from);
    std::string these = err.substr(from, end - from);
    // What follows the flags (", or start a new run …", " and leave out …") is no flag.
    for (const std::string stop : {", or ", " and "})
      if (const auto cut = these.find(stop); cut != std::string::npos) these.resize(cut);
    flags += " " + these;
  }
  return flags;
}

// A resume that changes the objective ([model] label_smoothing), the optimizer and the schedule,
// in the run's own folder: each change is named; the discarded continuation keeps the config it
// trained with; and a later resume of the same checkpoint, whose config.toml now holds the new
// values, follows the warnings' flags to repeat the original run bit for bit.
TEST_F(ResumeAdvice, TheWarningsFlagsKeepTheOldAndTheOldConfigIsKeptAside) {
  const auto full = dir_ / "full", run_dir = dir_ / "run";
  ASSERT_EQ(run("train " + quickstart() + kCommon + " --run-dir " + full.string()).exit_code, 0);
  ASSERT_EQ(run("train " + quickstart() + kCommon + " --run-dir " + run_dir.string()).exit_code, 0);
  const auto at10 = (run_dir / "checkpoints" / "step-00000010.mxt").string();
  auto r = run("train --resume " + at10 +
               " --set model.label_smoothing=0.1 --set optimizer.adamw.beta1=0.5"
               " --set optimizer.warmup_steps=5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err,
                  "was trained with another model: model.label_smoothing = 0.0 -> 0.1; the steps "
                  "from here train this config's. To keep the old model, resume with --set "
                  "model.label_smoothing=0.0"))
      << r.err;
  EXPECT_TRUE(has(r.err, "optimizer.adamw.beta1 = 0.9 -> 0.5")) << r.err;
  EXPECT_TRUE(has(r.err, "optimizer.warmup_steps = 20 -> 5")) << r.err;
  // The config that trained steps 11-20 went aside with them, and said so.
  const auto aside = run_dir / "config.discarded-after-step-10.toml";
  ASSERT_TRUE(fs::exists(aside)) << r.err;
  EXPECT_TRUE(has(r.err + r.out, "the config.toml it last trained with to " + aside.string()))
      << r.err;
  EXPECT_FALSE(has(slurp(aside), "label_smoothing = 0.1")) << slurp(aside);
  EXPECT_TRUE(has(slurp(run_dir / "config.toml"), "label_smoothing = 0.1"));
  // A checkpoint of the discarded continuation, resumed without a config, is pointed at it, and the
  // hint works as given (into a folder of its own: the checkpoint is no longer in checkpoints/).
  const auto discarded =
      (run_dir / "checkpoints.discarded-after-step-10" / "step-00000020.mxt").string();
  r = run("train --resume " + discarded);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(
      has(r.err, "name the config: mixtrain train " + aside.string() + " --resume " + discarded))
      << r.err;
  r = run("train " + aside.string() + " --resume " + discarded + " --set run.steps=21", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "was trained with")) << r.err;

  // The run's config.toml holds the new values now: the warnings' flags are the way back.
  r = run("train --resume " + at10);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string flags = offered_flags(r.err);
  for (const std::string flag :
       {"--set model.label_smoothing=0.0", "--set optimizer.adamw.beta1=0.9",
        "--set optimizer.warmup_steps=20"})
    EXPECT_TRUE(has(flags, flag)) << flags;
  r = run("train --resume " + at10 + flags);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "was trained with")) << r.err;
  EXPECT_EQ(step_losses(run_dir), step_losses(full));
  // The continuation the plain resume abandoned had its predecessor's settings: no config aside;
  // the one the flags abandoned had others.
  EXPECT_TRUE(fs::exists(run_dir / "checkpoints.discarded-after-step-10.2"));
  EXPECT_FALSE(fs::exists(run_dir / "config.discarded-after-step-10.2.toml"));
  EXPECT_TRUE(fs::exists(run_dir / "config.discarded-after-step-10.3.toml"));
}

// SGD with momentum 0 keeps no buffer, so a resume with momentum is refused before anything is
// announced as applied, naming the option change and the two ways on; the first one works.
TEST_F(ResumeAdvice, MomentumTheRunNeverKeptIsRefusedNamingTheOption) {
  const auto dir = dir_ / "run";
  const std::string sgd = " --set optimizer.type=sgd --set optimizer.sgd.lr=0.05";
  ASSERT_EQ(run("train " + quickstart() + kCommon + sgd + " --run-dir " + dir.string()).exit_code,
            0);
  const auto at10 = (dir / "checkpoints" / "step-00000010.mxt").string();
  auto r = run("train --resume " + at10 + " --set optimizer.sgd.momentum=0.9");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err,
                  "this run gives the optimizer other options (optimizer.sgd.momentum = 0.0 -> "
                  "0.9), which need state the checkpoint's run never kept"))
      << r.err;
  EXPECT_FALSE(has(r.err, "checkpoint format did not keep")) << r.err;
  EXPECT_FALSE(has(r.err, "the steps from here use the new ones")) << r.err;
  EXPECT_TRUE(has(r.err,
                  "--set optimizer.sgd.momentum=0.0, or start a new run from these "
                  "weights: checkpoint.init_from = \"" +
                      at10 + "\""))
      << r.err;
  r = run("train --resume " + at10 + " --set optimizer.sgd.momentum=0.0");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A checkpoint from before a policy switch, resumed with the run's config.toml (which names the
// switched-to policy): the refusal offers the checkpoint's own policy, which repeats the run bit
// for bit; eval of that checkpoint with the same config.toml warns with the same flag.
TEST_F(ResumeAdvice, APolicyMismatchOffersTheCheckpointsOwnPolicy) {
  const auto full = dir_ / "full", dir = dir_ / "run";
  ASSERT_EQ(run("train " + quickstart() + kCommon + " --run-dir " + full.string()).exit_code, 0);
  ASSERT_EQ(run("train " + quickstart() + kCommon + " --run-dir " + dir.string()).exit_code, 0);
  const auto at10 = (dir / "checkpoints" / "step-00000010.mxt").string();
  ASSERT_EQ(run("train --resume " + at10 + " --set precision.policy=bf16-mixed").exit_code, 0);
  // step-10 was trained under fp32; the folder's config.toml now names bf16-mixed.
  auto r = run("eval " + (dir / "config.toml").string() + " --checkpoint " + at10);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "For the run's, add --set precision.policy=fp32")) << r.err;
  r = run("train --resume " + at10);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--set precision.policy=fp32")) << r.err;
  r = run("train --resume " + at10 + " --set precision.policy=fp32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(step_losses(dir), step_losses(full));
}

// Other data (rows or seed) cannot continue the sampler's order: refused, naming the key and both
// values, with the flag that resumes and the init_from route; the flag works.
TEST_F(ResumeAdvice, OtherDataIsRefusedNamingTheKeys) {
  const auto dir = dir_ / "run";
  ASSERT_EQ(run("train " + quickstart() + kCommon + " --run-dir " + dir.string()).exit_code, 0);
  const auto at10 = (dir / "checkpoints" / "step-00000010.mxt").string();
  auto r = run("train --resume " + at10 + " --set data.eval_fraction=0.2");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "was trained on other data (")) << r.err;
  EXPECT_TRUE(has(r.err, "): data.eval_fraction = 0.1 -> 0.2")) << r.err;
  EXPECT_TRUE(has(r.err,
                  "resume with --set data.eval_fraction=0.1, or start a new run from "
                  "these weights: checkpoint.init_from = \""))
      << r.err;
  r = run("train --resume " + at10 + " --set run.seed=7");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "run.seed = 1 -> 7")) << r.err;
  r = run("train --resume " + at10 + " --set data.eval_fraction=0.1");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// An override added on resume changes the numbers as an option of the policy does: named, with
// how to keep the old (an entry no --set removes).
TEST_F(ResumeAdvice, AnAddedOverrideIsNamed) {
  const auto dir = dir_ / "run";
  const std::string bf16 = " --set precision.policy=bf16-mixed";
  ASSERT_EQ(run("train " + quickstart() + kCommon + bf16 + " --run-dir " + dir.string()).exit_code,
            0);
  const auto at10 = (dir / "checkpoints" / "step-00000010.mxt").string();
  const auto ov = write_file("ov.toml",
                             "[[precision.override]]\nlayers = \"head\"\ngemm_input = \"fp32\"\n"
                             "weight = \"fp32\"\n");
  auto r = run("train --resume " + at10 + " --merge " + ov.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err,
                  "was trained with other [precision] options: precision.override[0] = (none) "
                  "-> {layers = \"head\", "))
      << r.err;
  EXPECT_TRUE(has(r.err, "To keep the old ones, leave out precision.override[0] in the config"))
      << r.err;
}

}  // namespace
