// Integration: the training toolbox a PyTorch user expects, through the real executable — the
// learning-rate schedules' config keys and what a run logs under them; top-k accuracy in the
// eval records, summary.json and `mixtrain eval`, against numpy on `mixtrain predict`'s logits;
// early stopping (when it stops, what it says, and the same stop after a resume); the best
// checkpoint (checkpoint.keep_best: which evaluation, its file, and across resumes); label
// smoothing (the training objective only: evaluation reports plain cross-entropy).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>

#include "cli_test_support.h"
#include "npy_test_support.h"

namespace mixtrain::test {
namespace {

class Toolbox : public CliTest {
 protected:
  // (step, eval_loss) of every evaluation record.
  static std::vector<std::pair<int, double>> eval_losses(const fs::path& run_dir) {
    std::vector<std::pair<int, double>> out;
    for (const auto& rec : records(run_dir / "metrics.jsonl"))
      if (rec.contains("eval_loss"))
        out.emplace_back(rec["step"].get<int>(), rec["eval_loss"].get<double>());
    return out;
  }
};

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
  // The resolved config writes every key, defaults included (a run folder's config.toml, which
  // `train --resume RUN` reads): keys at their defaults are not reported unread.
  EXPECT_FALSE(has(again.err, "is not read")) << again.err;
  r = run("check " + quickstart() + " --set optimizer.schedule=onecycle" +
          " --set optimizer.warmup_steps=0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  resolved = write_file("onecycle.toml", r.out.substr(0, r.out.find("\n# data:")));
  again = run("check " + resolved.string());
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_TRUE(has(again.out, "schedule = \"onecycle\"")) << again.out;
  EXPECT_FALSE(has(again.err, "is not read")) << again.err;
}

// Every step is applied (fp32, no scaler), so step s runs at lr_at(s - 1): warm-up over 2 steps,
// then the milestones 3 and 6 of the schedule's own clock.
// A multistep milestone the run never reaches (warm-up counted) is valid but likely a slip: check
// and train warn of it, naming the entry, where it was set, and the step it would fall on.
TEST_F(Toolbox, AMilestoneBeyondRunStepsIsWarnedAbout) {
  const std::string sets =
      " --set optimizer.schedule=multistep --set optimizer.warmup_steps=20"
      " --set optimizer.milestones=[10,100] --set run.steps=100";
  auto r = run("check " + quickstart() + sets);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err,
                  "optimizer.milestones (--set optimizer.milestones=[10,100]): entry 1 "
                  "(100, after 20 warm-up steps: step 120) is beyond run.steps = 100"))
      << r.err;
  EXPECT_FALSE(has(r.err, "entry 0")) << r.err;  // step 30 is reached
  auto reached = run("check " + quickstart() + sets + " --set run.steps=120");
  ASSERT_EQ(reached.exit_code, 0) << reached.err;
  EXPECT_FALSE(has(reached.err, "beyond run.steps")) << reached.err;
}

// A milestone at the largest int64 is beyond any run, however long the warm-up (the step it falls
// on would overflow).
TEST_F(Toolbox, AMilestoneAtTheLargestIntegerIsWarnedAboutAfterAWarmUp) {
  auto r = run("check " + quickstart() +
               " --set optimizer.schedule=multistep --set optimizer.warmup_steps=5"
               " --set optimizer.milestones=[9223372036854775807]");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "entry 0 (9223372036854775807, after 5 warm-up steps")) << r.err;
}

// Valid schedule values that are more likely slips: a warm-up the run never finishes, and rates
// that rise above the optimizer's lr. Each is a warning naming its key and where it was set; the
// ordinary values are not.
TEST_F(Toolbox, ASchedulePastItsPeakOrNeverReachingItIsWarnedAbout) {
  const auto steps = [](int n) { return " --set run.steps=" + std::to_string(n); };
  auto r = run("check " + quickstart() + steps(20) + " --set optimizer.warmup_steps=50");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err,
                  "optimizer.warmup_steps (--set optimizer.warmup_steps=50): 50 is not "
                  "below run.steps = 20: the lr never reaches optimizer.lr"))
      << r.err;
  r = run("check " + quickstart() + steps(20) + " --set optimizer.warmup_steps=20");
  EXPECT_TRUE(has(r.err, "the lr reaches optimizer.lr at the last step")) << r.err;
  r = run("check " + quickstart() + steps(21) + " --set optimizer.warmup_steps=20");
  EXPECT_FALSE(has(r.err, "optimizer.warmup_steps")) << r.err;
  r = run("check " + quickstart() +
          " --set optimizer.schedule=step --set optimizer.warmup_steps=0 --set optimizer.gamma=3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "optimizer.gamma (--set optimizer.gamma=3): 3.0 multiplies the lr up"))
      << r.err;
  const std::string onecycle =
      " --set optimizer.schedule=onecycle --set optimizer.warmup_steps=0 --set optimizer.min_lr=0";
  r = run("check " + quickstart() + onecycle + " --set optimizer.div_factor=0.5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err,
                  "optimizer.div_factor (--set optimizer.div_factor=0.5): 0.5 starts "
                  "onecycle at lr / div_factor, above optimizer.lr"))
      << r.err;
  r = run("check " + quickstart() + onecycle + " --set optimizer.final_div_factor=0.01");
  EXPECT_TRUE(has(r.err, "ends onecycle at lr / (div_factor x final_div_factor), above")) << r.err;
  r = run("check " + quickstart() + onecycle);
  EXPECT_FALSE(has(r.err, "div_factor")) << r.err;
}

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

bool numpy_available() {
  static const bool ok = std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
  return ok;
}

// numpy's count of top-k hits (top_k_reference.py) of a logits .npy against a labels .npy.
json numpy_top_k(const fs::path& dir, const fs::path& logits, const fs::path& labels, int k) {
  const auto out = dir / "topk.out";
  const std::string cmd = std::string("/usr/bin/python3 ") + MIXTRAIN_CONFIGS_DIR +
                          "/../tests/integration/top_k_reference.py " + logits.string() + " " +
                          labels.string() + " " + std::to_string(k) + " >" + out.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return json::parse(slurp(out), nullptr, false);
}

// Six Gaussian clusters in 8 dimensions, overlapping enough that top-1 stays well below 1.
void write_clusters(const fs::path& dir, int rows) {
  std::mt19937 rng(5);
  std::normal_distribution<float> noise(0.0f, 1.5f);
  std::vector<float> x;
  std::vector<std::int64_t> y;
  for (int r = 0; r < rows; ++r) {
    const int c = r % 6;
    y.push_back(c);
    for (int f = 0; f < 8; ++f)
      x.push_back((f == c || f == (c + 1) % 8 ? 1.5f : 0.0f) + noise(rng));
  }
  write_npy(dir / "x.npy", "<f4", {rows, 8}, x);
  write_npy(dir / "y.npy", "<i8", {rows}, y);
}

// bf16 logits tie often enough to exercise the tie rule; eval_fraction = 0 evaluates every row
// in the file's order, in the batches predict uses.
const char* kClusters = R"(
[run]
name = "clusters"
seed = 3
steps = 12
eval_every = 6
[backend]
type = "cpu"
threads = 1
[precision]
policy = "bf16-mixed"
[optimizer]
type = "adamw"
[optimizer.adamw]
lr = 0.01
[model]
layers = [ { type = "linear", out = 16 }, { type = "relu" }, { type = "linear", out = 6 } ]
[data]
source = "npy"
batch_size = 16
eval_batch_size = 25
eval_fraction = 0.0
[data.npy]
features = "x.npy"
labels = "y.npy"
[eval]
top_k = 3
[checkpoint]
fsync = false
)";

TEST_F(Toolbox, TopKAccuracyIsNumpysOnTheLogitsInEveryEvalRecordSummaryAndEval) {
  write_clusters(dir_, 150);
  const auto cfg = write_file("clusters.toml", kClusters).string();
  auto r = run("train " + cfg + " --run-dir run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int evals = 0;
  for (const auto& rec : records(dir_ / "run" / "metrics.jsonl"))
    if (rec.contains("eval_loss")) {
      ++evals;
      ASSERT_TRUE(rec.contains("eval_top3_accuracy")) << rec.dump();
      EXPECT_GE(rec["eval_top3_accuracy"].get<double>(), rec["eval_accuracy"].get<double>());
    }
  EXPECT_EQ(evals, 2);
  const json sum = summary(dir_ / "run");
  r = run("eval " + cfg + " --checkpoint run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json eval = json::parse(r.out);
  ASSERT_TRUE(eval.contains("eval_top3_accuracy")) << r.out;
  EXPECT_EQ(eval["eval_top3_accuracy"], sum["eval_top3_accuracy"]);
  const double top3 = eval["eval_top3_accuracy"].get<double>();
  EXPECT_GT(top3, eval["eval_accuracy"].get<double>());
  EXPECT_LT(top3, 1.0) << "a top-3 of 1 would not tell a wrong count from a right one";
  if (!numpy_available()) GTEST_SKIP() << "/usr/bin/python3 cannot import numpy; not compared";
  r = run("predict " + cfg + " --checkpoint run --input x.npy --labels y.npy --out p.npy", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json theirs = numpy_top_k(dir_, dir_ / "p.npy", dir_ / "y.npy", 3);
  ASSERT_EQ(theirs["labels"], 150);
  EXPECT_EQ(top3, theirs["hits"].get<double>() / 150.0);
  // k = 1 by the same rule is eval_accuracy: ties go to the lowest index, as argmax does.
  const json top1 = numpy_top_k(dir_, dir_ / "p.npy", dir_ / "y.npy", 1);
  EXPECT_EQ(eval["eval_accuracy"].get<double>(), top1["hits"].get<double>() / 150.0);
}

TEST_F(Toolbox, TopKOfALanguageModelCountsEveryPositionsNextToken) {
  std::string text;
  for (int i = 0; text.size() < 600; ++i)
    text += "the cat sat on mat " + std::to_string(i % 7) + "\n";
  std::ofstream(dir_ / "train.txt") << text;
  const std::string held_out = text.substr(0, 8 * 10 + 1);  // 10 windows, every target inside
  std::ofstream(dir_ / "eval.txt") << held_out;
  const auto cfg = write_file("gpt.toml", R"(
[run]
seed = 4
steps = 6
[backend]
type = "cpu"
threads = 1
[model]
preset = "gpt"
[model.gpt]
n_layer = 1
n_head = 2
n_embd = 16
[data]
source = "text"
block_size = 8
batch_size = 4
eval_batch_size = 3
[data.text]
path = ["train.txt"]
eval = ["eval.txt"]
[eval]
top_k = 5
[checkpoint]
fsync = false
)")
                       .string();
  ASSERT_EQ(run("train " + cfg + " --run-dir run", dir_).exit_code, 0);
  auto r = run("eval " + cfg + " --checkpoint run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json eval = json::parse(r.out);
  ASSERT_TRUE(eval.contains("eval_top5_accuracy")) << r.out;
  const double top5 = eval["eval_top5_accuracy"].get<double>();
  EXPECT_GT(top5, 0.0);
  EXPECT_LT(top5, 1.0);
  if (!numpy_available()) GTEST_SKIP() << "/usr/bin/python3 cannot import numpy; not compared";
  r = run("predict " + cfg + " --checkpoint run --input eval.txt --out all.npy --positions all",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::int64_t> next;  // window w, position p predicts byte w * 8 + p + 1
  for (std::size_t i = 1; i <= 80; ++i) next.push_back(static_cast<unsigned char>(held_out[i]));
  write_npy(dir_ / "next.npy", "<i8", {10, 8}, next);
  const json theirs = numpy_top_k(dir_, dir_ / "all.npy", dir_ / "next.npy", 5);
  ASSERT_EQ(theirs["labels"], 80);
  EXPECT_EQ(top5, theirs["hits"].get<double>() / 80.0);
}

TEST_F(Toolbox, TopKOfOneOrAboveTheClassesExits2AtTheKey) {
  auto r = run("check " + quickstart() + " --set eval.top_k=1");
  expect_config_error(r, "--set eval.top_k=1", "eval.top_k");
  EXPECT_TRUE(has(r.err, "top-1 accuracy is eval_accuracy")) << r.err;
  r = run("check " + quickstart() + " --set eval.top_k=11");
  expect_config_error(r, "--set eval.top_k=11", "eval.top_k");
  EXPECT_TRUE(has(r.err, "the model has only 10 classes")) << r.err;
  // The hint names the bound, never a "usual" value the model may refuse too.
  EXPECT_TRUE(has(r.err, "a top_k of at most the number of classes, 10, or 0")) << r.err;
  EXPECT_FALSE(has(r.err, "usual")) << r.err;
  r = run("check " + quickstart() + " --set eval.top_k=-2");
  expect_config_error(r, "--set eval.top_k=-2", "eval.top_k");
}

// Evaluations every 5 steps at a constant rate; a min_delta of 10 nats is never met, so after
// the first evaluation (the best, at step 5) every one is bad: patience 2 stops at step 15.
std::string never_improving(int steps) {
  return tiny(steps) +
         " --set run.eval_every=5 --set optimizer.schedule=constant"
         " --set run.early_stopping_patience=2 --set run.early_stopping_min_delta=10"
         " --set checkpoint.every=5 --set checkpoint.keep=100";
}

TEST_F(Toolbox, EarlyStoppingStopsWhenPatienceRunsOutWritesTheFinalCheckpointAndSaysWhy) {
  const auto dir = dir_ / "run";
  auto r = run("train " + quickstart() + never_improving(200) + " --run-dir " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "stopped early: 15 steps")) << r.out;
  EXPECT_TRUE(has(r.out,
                  "stopped early: eval_loss did not improve by more than 10 in 2 "
                  "evaluations in a row (best "))
      << r.out;
  const json sum = summary(dir);
  EXPECT_EQ(sum["steps"], 15);
  EXPECT_EQ(sum["stopped_early"], true);
  EXPECT_EQ(sum["interrupted"], false);
  EXPECT_EQ(sum["diverged"], false);
  EXPECT_EQ(sum["eval_step"], 15);
  const json& es = sum["early_stopping"];
  EXPECT_EQ(es["metric"], "eval_loss");
  EXPECT_EQ(es["patience"], 2);
  EXPECT_EQ(es["best_step"], 5);
  EXPECT_EQ(es["evaluations_without_improvement"], 2);
  EXPECT_TRUE(has(es["reason"].get<std::string>(), "at step 5")) << es.dump();
  EXPECT_TRUE(fs::exists(dir / "checkpoints" / "step-00000015.mxt"));
  EXPECT_FALSE(fs::exists(dir / "checkpoints" / "step-00000020.mxt"));
  std::vector<int> evals;
  for (const auto& rec : records(dir / "metrics.jsonl"))
    if (rec.contains("eval_loss")) evals.push_back(rec["step"].get<int>());
  EXPECT_EQ(evals, (std::vector<int>{5, 10, 15}));

  // Patience that is never used up: the run goes to its end and says it did not stop early.
  r = run("train " + quickstart() + tiny(20) +
          " --set run.eval_every=5 --set run.early_stopping_patience=10 --run-dir " +
          (dir_ / "full").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json full = summary(dir_ / "full");
  EXPECT_EQ(full["steps"], 20);
  EXPECT_EQ(full["stopped_early"], false);
  EXPECT_FALSE(full["early_stopping"].contains("reason"));
}

// The count of bad evaluations is in the checkpoint: a run stopped at step 10 and resumed stops
// at step 15 as the uninterrupted one does (starting afresh, it would stop at step 25).
TEST_F(Toolbox, EarlyStoppingCountsOnAcrossAResume) {
  const auto dir = dir_ / "run";
  auto r = run("train " + quickstart() + never_improving(10) + " --run-dir " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(summary(dir)["stopped_early"], false);
  EXPECT_EQ(summary(dir)["early_stopping"]["evaluations_without_improvement"], 1);
  r = run("train " + quickstart() + never_improving(200) + " --resume " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json sum = summary(dir);
  EXPECT_EQ(sum["steps"], 15);
  EXPECT_EQ(sum["stopped_early"], true);
  EXPECT_EQ(sum["early_stopping"]["best_step"], 5);
  // Resuming the stopped run trains on to the next evaluation, which counts a third: the reason
  // says 3, as the count does, not the patience of 2.
  r = run("train " + quickstart() + never_improving(200) + " --resume " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json again = summary(dir);
  EXPECT_EQ(again["steps"], 20);
  EXPECT_EQ(again["early_stopping"]["evaluations_without_improvement"], 3);
  EXPECT_TRUE(has(again["early_stopping"]["reason"].get<std::string>(), "in 3 evaluations"))
      << again["early_stopping"].dump();

  // A run that ends off the evaluation grid (step 7) evaluates there, but that evaluation counts
  // for neither patience nor the best: resumed, it stops at 15 as the uninterrupted run does (one
  // more bad evaluation would stop it at 10).
  const auto off_grid = dir_ / "off-grid";
  r = run("train " + quickstart() + never_improving(7) + " --run-dir " + off_grid.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(summary(off_grid)["eval_step"], 7);
  EXPECT_EQ(summary(off_grid)["early_stopping"]["evaluations_without_improvement"], 0);
  r = run("train " + quickstart() + never_improving(200) + " --resume " + off_grid.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(summary(off_grid)["steps"], 15);
  EXPECT_EQ(summary(off_grid)["early_stopping"]["best_step"], 5);

  // A checkpoint without the state (an older one, or a run without early stopping) resumes and
  // starts counting afresh: best at 15, then 20 and 25 bad.
  const auto plain = dir_ / "plain";
  r = run("train " + quickstart() + tiny(10) +
          " --set run.eval_every=5 --set optimizer.schedule=constant --run-dir " + plain.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("train " + quickstart() + never_improving(200) + " --resume " + plain.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "holds no early stopping state; it starts afresh")) << r.err;
  EXPECT_EQ(summary(plain)["steps"], 25);
  EXPECT_EQ(summary(plain)["early_stopping"]["best_step"], 15);
}

TEST_F(Toolbox, EarlyStoppingThatCannotWorkExits2AtTheKey) {
  const std::string q = "check " + quickstart() + " --set run.early_stopping_patience=3";
  auto r = run(q + " --set run.eval_every=0");
  expect_config_error(r, "--set run.early_stopping_patience=3", "run.early_stopping_patience");
  EXPECT_TRUE(has(r.err, "run.eval_every = 0")) << r.err;
  r = run(q + " --set run.early_stopping_metric=loss");
  expect_config_error(r, "--set run.early_stopping_metric=loss", "run.early_stopping_metric");
  EXPECT_TRUE(has(r.err, "did you mean 'eval_loss'?")) << r.err;
  r = run(q + " --set run.early_stopping_metric=eval_top5_accuracy");
  expect_config_error(r, "--set run.early_stopping_metric=eval_top5_accuracy",
                      "run.early_stopping_metric");
  EXPECT_TRUE(has(r.err, "needs [eval] top_k = k")) << r.err;
  r = run(q + " --set run.early_stopping_metric=eval_top5_accuracy --set eval.top_k=5");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run(q + " --set run.early_stopping_min_delta=-0.1");
  expect_config_error(r, "--set run.early_stopping_min_delta=-0.1", "run.early_stopping_min_delta");
  r = run(q + " --set run.early_stopping_patience=-1");
  expect_config_error(r, "--set run.early_stopping_patience=-1", "run.early_stopping_patience");
  // Without patience the other two are read by nothing: a warning, not an error.
  r = run("check " + quickstart() + " --set run.early_stopping_min_delta=0.5");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err,
                  "run.early_stopping_min_delta (--set run.early_stopping_min_delta=0.5) "
                  "is not read: early_stopping_patience = 0 (off)"))
      << r.err;
}

std::string keep_best(int steps) {
  return tiny(steps) + " --set run.eval_every=5 --set checkpoint.keep_best=eval_loss";
}

TEST_F(Toolbox, KeepBestKeepsTheLowestEvalLossesCheckpointBesideTheStepOnes) {
  const auto dir = dir_ / "run";
  auto r = run("train " + quickstart() + keep_best(30) +
               " --set checkpoint.every=10 --set checkpoint.keep=1 --run-dir " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto evals = eval_losses(dir);
  ASSERT_EQ(evals.size(), 6u);
  auto best = evals.front();
  for (const auto& e : evals)
    if (e.second < best.second) best = e;  // strictly lower: a tie keeps the earlier
  const json b = summary(dir)["best_checkpoint"];
  EXPECT_EQ(b["metric"], "eval_loss");
  EXPECT_EQ(b["step"], best.first);
  EXPECT_EQ(b["value"].get<double>(), best.second);
  const fs::path file = dir / "checkpoints" / "best.mxt";
  EXPECT_EQ(b["path"], file.string());
  ASSERT_TRUE(fs::exists(file));
  // The file is that evaluation's checkpoint: evaluating it gives the same loss.
  r = run("eval " + quickstart() + keep_best(30) + " --checkpoint " + file.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["eval_loss"].get<double>(), best.second);
  // Pruning keeps one step checkpoint, and the folder still means the newest step.
  EXPECT_TRUE(fs::exists(dir / "checkpoints" / "step-00000030.mxt"));
  EXPECT_FALSE(fs::exists(dir / "checkpoints" / "step-00000020.mxt"));
  r = run("eval " + quickstart() + keep_best(30) + " --checkpoint " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["eval_loss"].get<double>(), evals.back().second);
}

// A resumed run goes on from the restored best: evaluations worse than it (weights decayed
// towards zero) write nothing, in the run's folder or in a new one the best is copied into.
TEST_F(Toolbox, KeepBestIsRestoredOnResumeSoAWorseRunNeverOverwritesIt) {
  const auto a = dir_ / "a";
  auto r = run("train " + quickstart() + keep_best(10) + " --run-dir " + a.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json before = summary(a)["best_checkpoint"];
  const std::string bytes = slurp(a / "checkpoints" / "best.mxt");
  const std::string worse = keep_best(30) + " --set optimizer.weight_decay=100";
  for (const auto& [target, into] :
       {std::pair{a, std::string()},
        std::pair{dir_ / "b", " --run-dir " + (dir_ / "b").string()}}) {
    SCOPED_TRACE(target.string());
    r = run("train " + quickstart() + worse + " --resume " +
            (a / "checkpoints" / "step-00000010.mxt").string() + into);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const auto& [step, loss] : eval_losses(target))
      if (step > 10) {
        EXPECT_GT(loss, before["value"].get<double>()) << "step " << step;
      }
    const json after = summary(target)["best_checkpoint"];
    EXPECT_EQ(after["step"], before["step"]);
    EXPECT_EQ(after["value"], before["value"]);
    EXPECT_EQ(after["path"], (target / "checkpoints" / "best.mxt").string());
    EXPECT_EQ(slurp(target / "checkpoints" / "best.mxt"), bytes);
    if (!into.empty()) {
      EXPECT_TRUE(has(r.err, "copied the best checkpoint (step ")) << r.err;
    }
  }
}

// Resuming an earlier checkpoint in its own folder abandons what came after it: a best written
// later moves aside with the later step checkpoints, and the continuation writes its own.
TEST_F(Toolbox, KeepBestFromAnAbandonedContinuationMovesAside) {
  const auto dir = dir_ / "run";
  const std::string args = keep_best(20) + " --set checkpoint.every=5 --set checkpoint.keep=10";
  auto r = run("train " + quickstart() + args + " --run-dir " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json first = summary(dir)["best_checkpoint"];
  ASSERT_GT(first["step"].get<int>(), 10) << "the loss should still fall after step 10";
  r = run("train " + quickstart() + args + " --resume " +
          (dir / "checkpoints" / "step-00000010.mxt").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir / "checkpoints.discarded-after-step-10" / "best.mxt"));
  EXPECT_TRUE(has(r.err, "it is from after the resumed step")) << r.err;
  // The continuation is bit for bit the first run: the same best, written again.
  EXPECT_EQ(summary(dir)["best_checkpoint"], first);
  EXPECT_TRUE(fs::exists(dir / "checkpoints" / "best.mxt"));
}

TEST_F(Toolbox, KeepBestThatCannotWorkExits2AtTheKey) {
  const std::string q = "check " + quickstart();
  auto r = run(q + " --set checkpoint.keep_best=loss");
  expect_config_error(r, "--set checkpoint.keep_best=loss", "checkpoint.keep_best");
  EXPECT_TRUE(has(r.err, "did you mean 'eval_loss'?")) << r.err;
  r = run(q + " --set checkpoint.keep_best=eval_accuracy --set run.eval_every=0");
  expect_config_error(r, "--set checkpoint.keep_best=eval_accuracy", "checkpoint.keep_best");
  EXPECT_TRUE(has(r.err, "run.eval_every = 0")) << r.err;
  r = run(q + " --set checkpoint.keep_best=eval_top3_accuracy");
  expect_config_error(r, "--set checkpoint.keep_best=eval_top3_accuracy", "checkpoint.keep_best");
  EXPECT_TRUE(has(r.err, "needs [eval] top_k = k")) << r.err;
  r = run(q + " --set checkpoint.keep_best=eval_top3_accuracy --set eval.top_k=3");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// [model] label_smoothing changes the training loss and so the weights, but evaluation reports
// plain cross-entropy: the checkpoint evaluated under a config without smoothing gives the run's
// own eval_loss bit for bit.
TEST_F(Toolbox, LabelSmoothingTrainsOnSmoothedTargetsAndEvaluatesPlainCrossEntropy) {
  const std::string base = tiny(12) + " --set run.log_every=1 --set run.eval_every=0";
  auto r = run("train " + quickstart() + base + " --run-dir " + (dir_ / "plain").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("train " + quickstart() + base + " --set model.label_smoothing=0.2 --run-dir " +
          (dir_ / "smooth").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto plain = records(dir_ / "plain" / "metrics.jsonl");
  const auto smooth = records(dir_ / "smooth" / "metrics.jsonl");
  ASSERT_FALSE(plain.empty());
  ASSERT_FALSE(smooth.empty());
  // The same initial weights and first batch: only the objective differs.
  EXPECT_NE(plain.front()["loss"], smooth.front()["loss"]);
  const double eval_loss = summary(dir_ / "smooth")["eval_loss"].get<double>();
  EXPECT_NE(eval_loss, summary(dir_ / "plain")["eval_loss"].get<double>());
  for (const std::string set : {"", " --set model.label_smoothing=0.2"}) {
    r = run("eval " + quickstart() + base + set + " --checkpoint " + (dir_ / "smooth").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out)["eval_loss"].get<double>(), eval_loss) << set;
  }
  r = run("plugins --describe host/model");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "\n  label_smoothing ")) << r.out;
  for (const std::string bad : {"1.5", "-0.1", "nan"}) {
    r = run("check " + quickstart() + " --set model.label_smoothing=" + bad);
    expect_config_error(r, "--set model.label_smoothing=" + bad, "model.label_smoothing");
  }
}

}  // namespace
}  // namespace mixtrain::test
