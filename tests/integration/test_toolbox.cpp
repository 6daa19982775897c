// Integration: the training toolbox a PyTorch user expects, through the real executable — the
// learning-rate schedules' config keys and what a run logs under them.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "cli_test_support.h"

namespace mixtrain::test {
namespace {

using Toolbox = CliTest;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A bad-input exit: code 2, one "error:" line naming `where` and `key`, and a hint.
void expect_config_error(const CliResult& r, const std::string& where, const std::string& key) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "error: ")) << r.err;
  EXPECT_TRUE(has(r.err, where)) << r.err;
  EXPECT_TRUE(has(r.err, "'" + key + "'")) << r.err;
  EXPECT_TRUE(has(r.err, "HINT: ")) << r.err;
}

// The quickstart, made small: 2048 rows of 8 features, 4 classes, batches of 64.
std::string tiny(int steps) {
  return " --set run.steps=" + std::to_string(steps) +
         " --set data.synthetic.rows=2048 --set data.synthetic.features=8"
         " --set data.synthetic.num_classes=4 --set model.layers.0.out=16"
         " --set model.layers.2.out=16 --set model.layers.4.out=4 --set data.batch_size=64";
}

TEST_F(Toolbox, ScheduleKeysThatCannotWorkExit2AtTheKey) {
  const std::string q = "check " + quickstart();
  const std::string multistep = " --set optimizer.schedule=multistep";
  const std::string onecycle = " --set optimizer.schedule=onecycle --set optimizer.warmup_steps=0";
  struct Bad {
    std::string sets, where, key, says;
  };
  const Bad bad[] = {
      {multistep, "quickstart.toml:", "optimizer.milestones", "is empty"},
      {multistep + " --set optimizer.milestones=[5,3]", "--set optimizer.milestones=[5,3]",
       "optimizer.milestones", "not strictly increasing"},
      {multistep + " --set optimizer.milestones=[5,5]", "--set optimizer.milestones=[5,5]",
       "optimizer.milestones", "not strictly increasing"},
      {multistep + " --set optimizer.milestones=[0,5]", "--set optimizer.milestones=[0,5]",
       "optimizer.milestones", "expected a step >= 1"},
      {multistep + " --set optimizer.milestones=[1.5]", "--set optimizer.milestones=[1.5]",
       "optimizer.milestones", "is not an integer"},
      {multistep + " --set optimizer.milestones=5", "--set optimizer.milestones=5",
       "optimizer.milestones", "expected a list of integers"},
      {" --set optimizer.schedule=step --set optimizer.gamma=0", "--set optimizer.gamma=0",
       "optimizer.gamma", "out of range"},
      {" --set optimizer.schedule=step --set optimizer.gamma=-0.5", "--set optimizer.gamma=-0.5",
       "optimizer.gamma", "out of range"},
      {" --set optimizer.schedule=step --set optimizer.step_size=0", "--set optimizer.step_size=0",
       "optimizer.step_size", "out of range"},
      {" --set optimizer.schedule=cosine", "--set optimizer.schedule=cosine", "optimizer.schedule",
       "is not a valid choice"},
      {onecycle + " --set optimizer.pct_start=1", "--set optimizer.pct_start=1",
       "optimizer.pct_start", "expected < 1"},
      {onecycle + " --set optimizer.pct_start=0", "--set optimizer.pct_start=0",
       "optimizer.pct_start", "out of range"},
      {onecycle + " --set optimizer.div_factor=0", "--set optimizer.div_factor=0",
       "optimizer.div_factor", "out of range"},
      {onecycle + " --set optimizer.final_div_factor=-1", "--set optimizer.final_div_factor=-1",
       "optimizer.final_div_factor", "out of range"},
      {onecycle + " --set run.steps=3", "quickstart.toml:", "optimizer.pct_start",
       "rising phase must span more than one step"},
      {" --set optimizer.schedule=onecycle", "quickstart.toml:24:", "optimizer.warmup_steps",
       "does not apply"},
      {onecycle + " --set optimizer.min_lr=0.001", "--set optimizer.min_lr=0.001",
       "optimizer.min_lr", "does not apply"},
      {" --set optimizer.schedule=inverse_sqrt --set optimizer.warmup_steps=0",
       "--set optimizer.warmup_steps=0", "optimizer.warmup_steps", "is 0"},
      {" --set optimizer.schedule=linear --set optimizer.min_lr=0.01",
       "--set optimizer.min_lr=0.01", "optimizer.min_lr", "above optimizer.lr"},
  };
  for (const auto& b : bad) {
    SCOPED_TRACE(b.sets);
    auto r = run(q + b.sets);
    expect_config_error(r, b.where, b.key);
    EXPECT_TRUE(has(r.err, b.says)) << r.err;
  }
  // Written in a file, the error points at the line of the key.
  auto cfg = write_file("multistep.toml",
                        "[run]\nsteps = 10\n[optimizer]\ntype = \"sgd\"\n"
                        "schedule = \"multistep\"\nmilestones = [8, 4]\n"
                        "[model]\nlayers = [{ type = \"linear\", out = 10 }]\n");
  expect_config_error(run("check " + cfg.string()), cfg.string() + ":6:", "optimizer.milestones");
}

TEST_F(Toolbox, KeysTheScheduleDoesNotReadAreWarnedAboutAndTheResolvedConfigRoundTrips) {
  auto r = run("check " + quickstart() + " --set optimizer.schedule=constant" +
               " --set optimizer.gamma=0.5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "optimizer.warmup_steps (" + quickstart() +
                             ":24:16) is not read by "
                             "schedule = \"constant\"; ignored"))
      << r.err;
  EXPECT_TRUE(has(r.err, "optimizer.gamma (--set optimizer.gamma=0.5) is not read")) << r.err;

  // The milestones list is written back as a list, and the resolved config runs as it is.
  r = run("check " + quickstart() + " --set optimizer.schedule=multistep" +
          " --set optimizer.milestones=[30,60]");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "milestones = [30, 60]\n")) << r.out;
  EXPECT_FALSE(has(r.err, "is not read")) << r.err;
  auto resolved = write_file("resolved.toml", r.out.substr(0, r.out.find("\n# data:")));
  auto again = run("check " + resolved.string());
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_TRUE(has(again.out, "milestones = [30, 60]\n")) << again.out;
}

// Every step is applied (fp32, no scaler), so step s runs at lr_at(s - 1): warm-up over 2 steps,
// then the milestones 3 and 6 of the schedule's own clock.
TEST_F(Toolbox, MultistepRunLogsTheRatesOfItsMilestones) {
  auto r = run("train " + quickstart() + tiny(12) +
               " --set run.log_every=1 --set run.eval_every=0 --set optimizer.schedule=multistep"
               " --set optimizer.warmup_steps=2 --set optimizer.milestones=[3,6]"
               " --set optimizer.gamma=0.5 --run-dir " +
               (dir_ / "run").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const double lr = 0.003;
  const double expected[] = {lr / 2, lr,     lr,     lr,     lr,     lr / 2,
                             lr / 2, lr / 2, lr / 4, lr / 4, lr / 4, lr / 4};
  int seen = 0;
  for (const auto& rec : records(dir_ / "run" / "metrics.jsonl")) {
    if (!rec.contains("lr")) continue;
    const auto step = rec["step"].get<int>();
    EXPECT_NEAR(rec["lr"].get<double>(), expected[step - 1], 1e-12 * lr) << "step " << step;
    ++seen;
  }
  EXPECT_EQ(seen, 12);
}

TEST_F(Toolbox, DescribeHostOptimizerListsTheScheduleKeys) {
  auto r = run("plugins --describe host/optimizer");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const std::string key : {"schedule", "warmup_steps", "min_lr", "step_size", "gamma",
                                "pct_start", "div_factor", "final_div_factor", "clip_grad_norm"})
    EXPECT_TRUE(has(r.out, "\n  " + key + " ")) << key << "\n" << r.out;
  EXPECT_TRUE(has(r.out, "milestones        integer list")) << r.out;
  EXPECT_TRUE(has(r.out, "inverse_sqrt")) << r.out;
  r = run("plugins --describe host/optimiser");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "did you mean 'host/optimizer'?")) << r.err;
}

}  // namespace
}  // namespace mixtrain::test
