// Integration tests: drive the real `mixtrain` executable and read what it writes.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>

#include "cli_test_support.h"
#include "npy_test_support.h"
#include "scoped_env.h"

namespace {

using namespace mixtrain::test;
using Cli = CliTest;

TEST_F(Cli, QuickstartTrainsAndWritesEveryOutput) {
  auto run_dir = dir_ / "run";
  auto r = run("train " + quickstart() + " --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto summary = json::parse(slurp(run_dir / "summary.json"));
  EXPECT_GT(summary["eval_accuracy"].get<double>(), 0.90);
  EXPECT_EQ(summary["steps"].get<int>(), 300);
  EXPECT_EQ(summary["skipped_steps"].get<int>(), 0);
  for (const char* key : {"final_loss", "peak_memory_bytes", "samples_per_s", "wall_seconds"})
    EXPECT_TRUE(summary.contains(key)) << key;
  EXPECT_GT(summary["peak_memory_bytes"].get<double>(), 0);

  auto recs = records(run_dir / "metrics.jsonl");
  std::vector<double> losses;
  int evals = 0;
  for (const auto& j : recs) {
    if (j.contains("loss")) {
      losses.push_back(j["loss"].get<double>());
      for (const char* key : {"step", "loss_scale", "skipped", "lr", "grad_norm", "samples_per_s"})
        EXPECT_TRUE(j.contains(key)) << key << " missing in " << j.dump();
    }
    if (j.contains("eval_accuracy")) ++evals;
  }
  ASSERT_GE(losses.size(), 10u);
  EXPECT_LT(losses.back(), 0.5 * losses.front());
  EXPECT_EQ(evals, 3);  // eval_every = 100 over 300 steps
  EXPECT_TRUE(fs::exists(run_dir / "config.toml"));
  EXPECT_TRUE(fs::exists(run_dir / "checkpoints" / "step-00000300.mxt"));
  EXPECT_TRUE(fs::exists(run_dir / "checkpoints" / "step-00000200.mxt"));
  EXPECT_FALSE(fs::exists(run_dir / "checkpoints" / "step-00000100.mxt"));  // keep = 2

  // The resolved config is itself a valid config that reproduces every effective value.
  auto resolved = slurp(run_dir / "config.toml");
  EXPECT_NE(resolved.find("eps = 1e-08"), std::string::npos) << "plugin defaults missing\n"
                                                             << resolved;
  EXPECT_NE(resolved.find("beta2 = 0.999"), std::string::npos) << resolved;
  auto c = run("check " + (run_dir / "config.toml").string());
  EXPECT_EQ(c.exit_code, 0) << c.err;

  // eval on the final checkpoint reproduces the run's own evaluation.
  auto ev = run("eval " + quickstart() + " --checkpoint " + (run_dir / "checkpoints").string());
  ASSERT_EQ(ev.exit_code, 0) << ev.err;
  auto evj = json::parse(ev.out);
  EXPECT_DOUBLE_EQ(evj["eval_accuracy"].get<double>(), summary["eval_accuracy"].get<double>());
}

// The final line prints the peak in a unit that shows it: a small model's few KiB were
// "peak memory 0.0 MiB".
TEST_F(Cli, TheFinalLinePrintsASmallPeakInKiB) {
  const auto cfg = write_file("tiny.toml", R"(
[run]
steps = 2
eval_every = 0
[backend]
type = "cpu"
threads = 1
[model]
layers = [ { type = "linear", out = 32 }, { type = "relu" }, { type = "linear", out = 3 } ]
[data]
source = "synthetic"
batch_size = 64
[data.synthetic]
kind = "clusters"
rows = 256
features = 16
num_classes = 3
[checkpoint]
fsync = false
)");
  const auto r = run("train " + cfg.string() + " --run-dir " + (dir_ / "run").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const double peak = summary(dir_ / "run")["peak_memory_bytes"].get<double>();
  ASSERT_GE(peak, 1024.0);
  ASSERT_LT(peak, 1024.0 * 1024.0);
  char text[64];
  std::snprintf(text, sizeof text, "peak memory %.1f KiB, ", peak / 1024.0);
  EXPECT_TRUE(has(r.out, text)) << text << "\n" << r.out;
  EXPECT_FALSE(has(r.out, "0.0 MiB")) << r.out;
}

TEST_F(Cli, SetSwapsTheOptimizerWithoutARebuild) {
  auto run_dir = dir_ / "run";
  auto r = run("train " + quickstart() + " --run-dir " + run_dir.string() +
               " --set optimizer.type=sgd --set optimizer.lr=0.05 --set optimizer.momentum=0.9"
               " --set run.steps=150");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto resolved = slurp(run_dir / "config.toml");
  EXPECT_NE(resolved.find("type = \"sgd\""), std::string::npos) << resolved;
  EXPECT_NE(resolved.find("momentum = 0.9"), std::string::npos) << resolved;
  EXPECT_NE(resolved.find("nesterov = false"), std::string::npos) << resolved;
  auto summary = json::parse(slurp(run_dir / "summary.json"));
  EXPECT_EQ(summary["optimizer"], "sgd");
  EXPECT_GT(summary["eval_accuracy"].get<double>(), 0.85);
}

// --profile's table is per training step: evaluations and checkpoints inside its window are paused
// out of it (the same backend calls per step as a run without them), and an early stop closes it
// at the last step. A resumed run's profile keeps the earlier one beside it; resuming an earlier
// checkpoint moves the abandoned continuation's aside.
TEST_F(Cli, TheProfileHoldsTrainingStepsAlone) {
  const std::string common = "train " + quickstart() + " --profile --set data.batch_size=32";
  const auto calls_per_step = [&](const fs::path& run) {
    const json p = json::parse(slurp(run / "profile.json"));
    std::map<std::string, double> out;
    for (const auto& e : p["entries"])
      out[e["scope"].get<std::string>() + " " + e["op"].get<std::string>()] =
          e["calls"].get<double>() / p["steps"].get<double>();
    // A step reads its loss back when it reports or keeps it (a logged, evaluated or saved step):
    // the step's own work, which the schedule of evaluations changes.
    out.erase("gradient checks copy_to_host");
    return out;
  };
  const auto quiet = dir_ / "quiet", busy = dir_ / "busy", early = dir_ / "early";
  ASSERT_EQ(run(common + " --set run.steps=12 --set run.eval_every=0 --set checkpoint.every=0" +
                " --run-dir " + quiet.string())
                .exit_code,
            0);
  ASSERT_EQ(run(common + " --set run.steps=12 --set run.eval_every=2 --set checkpoint.every=2" +
                " --set checkpoint.keep=10 --run-dir " + busy.string())
                .exit_code,
            0);
  EXPECT_EQ(calls_per_step(busy), calls_per_step(quiet));
  // The node table: every model node's ops, each a share of its (scope, op) row.
  const json q = json::parse(slurp(quiet / "profile.json"));
  ASSERT_FALSE(q["nodes"].empty());
  std::map<std::string, std::int64_t> node_calls;
  for (const auto& n : q["nodes"])
    node_calls[n["type"].get<std::string>() + " " + n["op"].get<std::string>()] +=
        n["calls"].get<std::int64_t>();
  for (const auto& node : node_calls) {
    // clang 14 cannot capture a structured binding in a lambda, so name the key plainly.
    const std::string& key = node.first;
    const std::int64_t calls = node.second;
    const auto row = std::find_if(q["entries"].begin(), q["entries"].end(), [&](const json& e) {
      return e["scope"].get<std::string>() + " " + e["op"].get<std::string>() == key;
    });
    ASSERT_NE(row, q["entries"].end()) << key;
    EXPECT_LE(calls, (*row)["calls"].get<std::int64_t>()) << key;
  }
  // An evaluation that never improves by 100 stops the run at its second one (step 8 of 200).
  auto r = run(common +
               " --set run.steps=200 --set run.eval_every=4 --set checkpoint.every=0"
               " --set run.early_stopping_patience=1 --set run.early_stopping_min_delta=100.0"
               " --run-dir " +
               early.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json p = json::parse(slurp(early / "profile.json"));
  EXPECT_EQ(p["last_step"], 8) << p.dump();
  EXPECT_EQ(p["first_step"], 2);
  EXPECT_EQ(calls_per_step(early), calls_per_step(quiet));

  r = run(common +
          " --set run.steps=16 --set run.eval_every=2 --set checkpoint.every=2"
          " --set checkpoint.keep=10 --resume " +
          busy.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(busy / "profile.steps-2-12.json"));
  EXPECT_EQ(json::parse(slurp(busy / "profile.json"))["first_step"], 14);
  r = run(common +
          " --set run.steps=16 --set run.eval_every=2 --set checkpoint.every=2"
          " --set checkpoint.keep=10 --resume " +
          (busy / "checkpoints" / "step-00000004.mxt").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(slurp(busy / "profile.discarded-after-step-4.json"))["first_step"], 14);
  EXPECT_EQ(json::parse(slurp(busy / "profile.json"))["first_step"], 6);
  // A profile of steps a resume keeps (6..16, then 17..20 unprofiled and abandoned) stays.
  const std::string plain = "train " + quickstart() +
                            " --set data.batch_size=32 --set run.steps=20 --set run.eval_every=2"
                            " --set checkpoint.every=2 --set checkpoint.keep=10 --resume ";
  ASSERT_EQ(run(plain + busy.string()).exit_code, 0);
  r = run(plain + (busy / "checkpoints" / "step-00000016.mxt").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(busy / "summary.discarded-after-step-16.json"));
  EXPECT_FALSE(fs::exists(busy / "profile.discarded-after-step-16.json"));
  EXPECT_EQ(json::parse(slurp(busy / "profile.json"))["last_step"], 16);
}

// run.step_graphs on a backend that records none (the CPU): the run says so once and trains op by
// op, with the same losses as without the option; unset (on where the backend records graphs),
// the CPU run says nothing of them.
TEST_F(Cli, StepGraphsOnABackendWithoutThemSaySoAndChangeNothing) {
  const std::string common = "train " + quickstart() + " --set run.steps=20 --set run.log_every=5";
  auto with = run("--log-level info " + common + " --set run.step_graphs=true --run-dir " +
                  (dir_ / "with").string());
  ASSERT_EQ(with.exit_code, 0) << with.err;
  const std::string all = with.out + with.err;
  EXPECT_NE(all.find("run.step_graphs: off (the backend records no step graphs)"),
            std::string::npos)
      << all;
  auto without = run("--log-level info " + common + " --run-dir " + (dir_ / "without").string());
  ASSERT_EQ(without.exit_code, 0) << without.err;
  EXPECT_EQ((without.out + without.err).find("step_graphs"), std::string::npos)
      << without.out + without.err;
  auto losses = [](const fs::path& dir) {
    std::vector<double> out;
    for (const auto& r : records(dir / "metrics.jsonl"))
      if (r.contains("loss")) out.push_back(r["loss"].get<double>());
    return out;
  };
  EXPECT_EQ(losses(dir_ / "with"), losses(dir_ / "without"));
  EXPECT_EQ(losses(dir_ / "with").size(), 4u);
}

// Past the file-size limit (ulimit -f) a checkpoint write fails with EFBIG, named with its file
// and hint (exit 2), and leaves no temporary file; SIGXFSZ used to kill the process mid-write.
TEST_F(Cli, AFileSizeLimitFailsTheCheckpointWriteWithAMessage) {
  const auto run_dir = dir_ / "run";
  const auto err = dir_ / "err.txt";
  const std::string cmd = "bash -c 'ulimit -f 48; exec " + std::string(MIXTRAIN_EXE) + " train " +
                          quickstart() + " --set run.steps=4 --run-dir " + run_dir.string() +
                          "' >/dev/null 2>" + err.string() + " </dev/null";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << "killed by a signal: " << slurp(err);
  EXPECT_EQ(WEXITSTATUS(status), 2) << slurp(err);
  EXPECT_TRUE(has(slurp(err), "File too large")) << slurp(err);
  EXPECT_TRUE(has(slurp(err), "this run has no checkpoint yet")) << slurp(err);
  for (const auto& f : fs::directory_iterator(run_dir / "checkpoints"))
    EXPECT_EQ(f.path().filename().string().find(".tmp"), std::string::npos) << f.path();
}

// --resume RUN takes the newest checkpoint; when that file is damaged the hint names the one
// before it, with the --resume that takes it; an error about a readable file's content does not.
TEST_F(Cli, ADamagedNewestCheckpointNamesTheOneBeforeIt) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + quickstart() + " --set run.steps=6 --set checkpoint.every=2" +
               " --set checkpoint.keep=3 --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  fs::resize_file(run_dir / "checkpoints" / "step-00000006.mxt", 100);
  r = run("train --resume " + run_dir.string() + " --set run.steps=8");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const std::string earlier = (run_dir / "checkpoints" / "step-00000004.mxt").string();
  EXPECT_TRUE(has(r.err, "the checkpoint before it is " + earlier + ": --resume " + earlier))
      << r.err;
  r = run("train --resume " + earlier + " --set run.steps=8");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // A readable checkpoint refused for its content is not called damaged.
  r = run("train --resume " + run_dir.string() + " --set run.steps=10 --set data.batch_size=32");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_FALSE(has(r.err, "the checkpoint before it")) << r.err;
}

// `check` of a policy that chooses says what it chose on this machine, as the run records it.
TEST_F(Cli, CheckOfAutoSaysWhatItResolvedTo) {
  auto r = run("check " + quickstart() + " --skip-rehearsal --set precision.policy=auto");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto run_dir = dir_ / "run";
  ASSERT_EQ(run("train " + quickstart() + " --set precision.policy=auto --set run.steps=1" +
                " --run-dir " + run_dir.string())
                .exit_code,
            0);
  const auto summary = json::parse(slurp(run_dir / "summary.json"));
  const std::string resolved = summary["precision"]["policy"].get<std::string>();
  EXPECT_NE(resolved, "auto");
  EXPECT_TRUE(has(r.out, "# precision policy: auto (resolved: " + resolved + ")")) << r.out;
}

// Resumed in place from the step that is the best, whose best.mxt (a later step's) went aside:
// the resumed checkpoint is the best state and becomes best.mxt (checkpoint.keep would prune
// it, and no file held the best the summary named).
TEST_F(Cli, AResumeFromTheBestStepKeepsItAsTheBestCheckpoint) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + quickstart() + " --set checkpoint.keep_best=eval_loss" +
               " --set run.eval_every=5 --set run.steps=20 --set checkpoint.every=10" +
               " --set checkpoint.keep=2 --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(json::parse(slurp(run_dir / "summary.json"))["best_checkpoint"]["step"], 20);
  // No improvement after step 10 (a learning rate of ~0), and keep = 1 prunes step 10's file.
  r = run("train " + (run_dir / "config.toml").string() + " --resume " +
          (run_dir / "checkpoints" / "step-00000010.mxt").string() +
          " --set optimizer.adamw.lr=1e-30 --set optimizer.adamw.weight_decay=0" +
          " --set checkpoint.keep=1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto best = json::parse(slurp(run_dir / "summary.json"))["best_checkpoint"];
  EXPECT_EQ(best["step"], 10) << best.dump();
  ASSERT_TRUE(best.contains("path")) << best.dump();
  EXPECT_TRUE(fs::exists(best["path"].get<std::string>()));
  r = run("eval " + (run_dir / "config.toml").string() + " --checkpoint " +
          best["path"].get<std::string>());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NEAR(json::parse(r.out)["eval_loss"].get<double>(), best["value"].get<double>(), 1e-6);
}

TEST_F(Cli, WrongTypeInConfigExits2WithFileLineColumn) {
  auto cfg = write_file("bad.toml", "[run]\nname = \"x\"\nsteps = \"ten\"\n");
  auto r = run("train " + cfg.string() + " --run-dir " + (dir_ / "run").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(cfg.string() + ":3:9"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("run.steps"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "run" / "metrics.jsonl"));
}

TEST_F(Cli, TomlSyntaxErrorExits2WithLocation) {
  auto cfg = write_file("syntax.toml", "[run]\nsteps = = 3\n");
  auto r = run("check " + cfg.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(cfg.string() + ":2:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("TOML syntax error"), std::string::npos) << r.err;
}

TEST_F(Cli, UnknownKeySuggestsTheNearestOne) {
  auto r = run("check " + quickstart() + " --set optimizer.weight_decy=0.1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("optimizer.weight_decy"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did you mean 'weight_decay'"), std::string::npos) << r.err;
}

TEST_F(Cli, UnknownPluginListsWhatExists) {
  auto r = run("check " + quickstart() + " --set scaler.type=dynamc");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no scaler named 'dynamc'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did you mean 'dynamic'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("static"), std::string::npos) << r.err;
}

TEST_F(Cli, PluginSemanticCheckFailsWithItsLocation) {
  auto r = run("check " + quickstart() +
               " --set scaler.type=dynamic --set scaler.min_scale=4096 --set scaler.init_scale=16");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("min_scale"), std::string::npos) << r.err;
}

TEST_F(Cli, MissingDataFileExits2NamingIt) {
  auto cfg = write_file("npy.toml",
                        "[model]\nlayers = [ { type = \"linear\", out = 2 } ]\n"
                        "[data]\nsource = \"npy\"\nfeatures = \"nowhere/x.npy\"\n"
                        "labels = \"nowhere/y.npy\"\n");
  auto r = run("train " + cfg.string() + " --run-dir " + (dir_ / "run").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("x.npy"), std::string::npos) << r.err;
}

TEST_F(Cli, ExistingRunFolderIsNeverOverwritten) {
  auto run_dir = dir_ / "run";
  fs::create_directories(run_dir);
  std::ofstream(run_dir / "metrics.jsonl") << "{\"step\": 1, \"loss\": 42}\n";
  auto r = run("train " + quickstart() + " --set run.steps=5 --run-dir " + run_dir.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("already holds a run"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(run_dir / "metrics.jsonl"), "{\"step\": 1, \"loss\": 42}\n");
  // Stopped before its first checkpoint: no --resume to offer (it would fail).
  EXPECT_EQ(r.err.find("--resume"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no checkpoint"), std::string::npos) << r.err;
  // With one, the hint offers to continue it.
  fs::create_directories(run_dir / "checkpoints");
  std::ofstream(run_dir / "checkpoints" / "step-00000001.mxt") << "x";
  r = run("train " + quickstart() + " --set run.steps=5 --run-dir " + run_dir.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--resume " + (run_dir / "checkpoints").string()), std::string::npos)
      << r.err;
}

TEST_F(Cli, CorruptCheckpointExits2AndNamesIt) {
  auto run_dir = dir_ / "run";
  auto r = run("train " + quickstart() + " --set run.steps=20 --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ckpt = run_dir / "checkpoints" / "step-00000020.mxt";
  ASSERT_TRUE(fs::exists(ckpt));
  auto bytes = slurp(ckpt);
  bytes[bytes.size() - 10] = static_cast<char>(bytes[bytes.size() - 10] ^ 0x5a);
  auto bad = dir_ / "bad.mxt";
  std::ofstream(bad, std::ios::binary) << bytes;
  auto r2 = run("train " + quickstart() + " --set run.steps=40 --resume " + bad.string() +
                " --run-dir " + (dir_ / "run2").string());
  EXPECT_EQ(r2.exit_code, 2);
  EXPECT_NE(r2.err.find("bad.mxt"), std::string::npos) << r2.err;
  // Truncated too.
  std::ofstream(bad, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  auto r3 = run("eval " + quickstart() + " --checkpoint " + bad.string());
  EXPECT_EQ(r3.exit_code, 2);
  EXPECT_NE(r3.err.find("bad.mxt"), std::string::npos) << r3.err;
}

// A run resumed from its step-N checkpoint reproduces the uninterrupted 2N-step run bit for bit,
// including the loss-scale trajectory of a dynamic scaler and the lr schedule.
TEST_F(Cli, ResumeReproducesTheUninterruptedRunBitForBit) {
  const std::string common =
      " --set run.steps=60 --set run.log_every=1 --set run.eval_every=0"
      " --set checkpoint.every=30 --set checkpoint.keep=5"
      " --set scaler.type=dynamic --set scaler.init_scale=1024"
      " --set scaler.growth_interval=7";
  auto full = dir_ / "full";
  auto r = run("train " + quickstart() + common + " --run-dir " + full.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto resumed = dir_ / "resumed";
  auto r2 =
      run("train " + quickstart() + common + " --resume " +
          (full / "checkpoints" / "step-00000030.mxt").string() + " --run-dir " + resumed.string());
  ASSERT_EQ(r2.exit_code, 0) << r2.err;

  auto a = records(full / "metrics.jsonl");
  auto b = records(resumed / "metrics.jsonl");
  std::map<int, json> by_step;
  for (const auto& j : a)
    if (j.contains("loss")) by_step[j["step"].get<int>()] = j;
  int compared = 0;
  for (const auto& j : b) {
    if (!j.contains("loss")) continue;
    int step = j["step"].get<int>();
    ASSERT_GT(step, 30);
    ASSERT_TRUE(by_step.count(step));
    EXPECT_EQ(j["loss"].get<double>(), by_step[step]["loss"].get<double>()) << "step " << step;
    EXPECT_EQ(j["loss_scale"].get<double>(), by_step[step]["loss_scale"].get<double>()) << step;
    EXPECT_EQ(j["lr"].get<double>(), by_step[step]["lr"].get<double>()) << step;
    ++compared;
  }
  EXPECT_EQ(compared, 30);
  // The scale really moved, so the scaler state was exercised.
  EXPECT_NE(by_step[60]["loss_scale"].get<double>(), 1024.0);
  auto sa = json::parse(slurp(full / "summary.json"));
  auto sb = json::parse(slurp(resumed / "summary.json"));
  EXPECT_EQ(sa["eval_loss"].get<double>(), sb["eval_loss"].get<double>());
}

// A resume keeps the run's batches: another data.batch_size (or run.accumulate) is refused with
// both values, before the data order could silently change.
TEST_F(Cli, ResumeWithAnotherBatchSizeExits2NamingBothValues) {
  const auto dir = dir_ / "run";
  ASSERT_EQ(run("train " + quickstart() + " --set run.steps=4 --set data.batch_size=32 --run-dir " +
                dir.string())
                .exit_code,
            0);
  auto r = run("train " + quickstart() + " --set run.steps=8 --set data.batch_size=64 --resume " +
               dir.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("data.batch_size = 32, this one has data.batch_size = 64"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--set data.batch_size=32"), std::string::npos) << r.err;
  r = run("train " + quickstart() +
          " --set run.steps=8 --set data.batch_size=32 "
          "--set run.accumulate=2 --resume " +
          dir.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("run.accumulate = 1"), std::string::npos) << r.err;
}

// The quickstart config's text without its fc2 layer and the relu after it ("" if the config no
// longer has them, which fails the test that asked).
std::string without_fc2(std::string text) {
  const std::string fc2 =
      "  { type = \"linear\", name = \"fc2\", out = 128 },\n  { type = \"relu\" },\n";
  const auto at = text.find(fc2);
  if (at == std::string::npos) {
    ADD_FAILURE() << "the quickstart has no fc2 layer to remove";
    return {};
  }
  return text.erase(at, fc2.size());
}

// A layer removed from the config: resuming would drop its weights and optimizer state silently.
TEST_F(Cli, ResumeIntoAModelWithoutALayerOfTheCheckpointExits2NamingIt) {
  const auto dir = dir_ / "run";
  ASSERT_EQ(run("train " + quickstart() + " --set run.steps=2 --run-dir " + dir.string()).exit_code,
            0);
  const auto shorter = write_file("shorter.toml", without_fc2(slurp(quickstart())));
  auto r = run("train " + shorter.string() + " --set run.steps=4 --resume " + dir.string() +
               " --run-dir " + (dir_ / "shorter").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("tensor 'param/fc2.weight' matches no parameter or buffer"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("checkpoint.init_from"), std::string::npos) << r.err;
  // Another activation keeps every tensor: the resume trains on, and says what changed.
  r = run("train " + quickstart() + " --set run.steps=4 --set model.layers.1.type=\"gelu\"" +
          " --resume " + dir.string() + " --run-dir " + (dir_ / "gelu").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err,
                  "was trained with another model: model.layers[1].type = \"relu\" -> "
                  "\"gelu\""))
      << r.err;
  // Recomputing outputs is the same model: nothing to say.
  r = run("train " + quickstart() + " --set run.steps=4 --set 'model.recompute=[\"linear\"]'" +
          " --resume " + dir.string() + " --run-dir " + (dir_ / "recomputed").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "another model")) << r.err;
}

// A resume on other data of the same row count and seed (another synthetic noise, another file
// of the same shape, shuffling turned off) trains on, but a warning names the [data] keys and the
// checksums that differ; the same data, or a loader-only key, says nothing.
TEST_F(Cli, ResumeOnOtherDataWarnsNamingWhatDiffers) {
  const auto dir = dir_ / "run";
  ASSERT_EQ(run("train " + quickstart() + " --set run.steps=2 --run-dir " + dir.string()).exit_code,
            0);
  const std::string resume = " --set run.steps=3 --resume " + dir.string() + " --run-dir ";
  auto r = run("train " + quickstart() + " --set data.prefetch=false" + resume +
               (dir_ / "same").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "other data")) << r.err;
  r = run("train " + quickstart() + " --set data.shuffle=false" + resume +
          (dir_ / "ordered").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(
      has(r.err, "was trained on other data or data settings: data.shuffle = true -> false;"))
      << r.err;
  // In order, the quickstart's 7,373 training rows leave 77 out of every epoch's 57 batches.
  EXPECT_TRUE(has(r.err,
                  "data.shuffle = false: the last 77 of the 7373 training rows never "
                  "train"))
      << r.err;
  r = run("eval " + (dir_ / "ordered" / "config.toml").string() + " --checkpoint " +
              (dir_ / "ordered").string(),
          dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "never train")) << "evaluation trains nothing: " << r.err;
  r = run("train " + quickstart() + " --set data.synthetic.noise=2.5" + resume +
          (dir_ / "noisier").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "was trained on other data or data settings: data.synthetic.noise = "))
      << r.err;
  EXPECT_TRUE(has(r.err, "training rows crc ")) << r.err;
  EXPECT_TRUE(has(r.err, "held-out rows crc ")) << r.err;
}

// eval, predict and sample run the checkpoint's model. A layer removed from the config leaves a
// tensor without a place: refused, naming the config keys the run had otherwise. Another model key
// with the same tensors (an activation) or another policy evaluates, but a warning names it.
TEST_F(Cli, InferenceWithAnotherModelThanTheCheckpointsIsRefusedOrWarned) {
  const auto dir = dir_ / "run";
  ASSERT_EQ(run("train " + quickstart() + " --set run.steps=2 --run-dir " + dir.string()).exit_code,
            0);
  const std::string text = slurp(quickstart());
  const std::string with_gelu = [&] {
    std::string t = text;
    const std::string relu = "{ type = \"relu\" }";
    return t.replace(t.find(relu), relu.size(), "{ type = \"gelu\" }");
  }();
  const auto shorter = write_file("shorter.toml", without_fc2(text));
  const auto inputs = dir_ / "x.npy";
  mixtrain::test::write_npy<float>(inputs, "<f4", {4, 32}, std::vector<float>(4 * 32, 0.5f));
  for (const std::string command : {"eval", "predict"}) {
    auto r = run(command + " " + shorter.string() + " --checkpoint " + dir.string() +
                 (command == "predict"
                      ? " --input " + inputs.string() + " --out " + (dir_ / "p.npy").string()
                      : ""));
    EXPECT_EQ(r.exit_code, 2) << command << r.err;
    EXPECT_TRUE(has(r.err,
                    "tensor 'param/fc2.weight' matches no parameter or buffer of this "
                    "config's model (its run had model.layers[2].name = \"fc2\" -> "))
        << command << r.err;
    EXPECT_TRUE(has(r.err, "run it with the config it was trained with")) << r.err;
    EXPECT_FALSE(fs::exists(dir_ / "p.npy"));
  }
  auto r = run("eval " + write_file("gelu.toml", with_gelu).string() + " --checkpoint " +
               dir.string() + " --set precision.policy=bf16-mixed");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err,
                  "was trained with another model or precision: model.layers[1].type = "
                  "\"relu\" -> \"gelu\", "))
      << r.err;
  EXPECT_TRUE(has(r.err,
                  "precision.policy = \"fp32\" -> \"bf16-mixed\"; the numbers are this "
                  "config's"))
      << r.err;
  // An export carries the run's config as "mixtrain.config": eval of it warns the same.
  const auto exported = dir_ / "w.safetensors";
  r = run("export " + dir.string() + " --format safetensors --out " + exported.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("eval " + (dir_ / "gelu.toml").string() + " --checkpoint " + exported.string() +
          " --set precision.policy=bf16-mixed");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err,
                  "was trained with another model or precision: model.layers[1].type = "
                  "\"relu\" -> \"gelu\", "))
      << r.err;
  r = run("eval " + (dir / "config.toml").string() + " --checkpoint " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "another model")) << r.err;
  // The 2-step run's 20 warm-up steps are training's matter: eval does not warn of them.
  EXPECT_FALSE(has(r.err, "optimizer.warmup_steps")) << r.err;
  // What only training reads changes no number at inference: no warning.
  r = run("eval " + (dir / "config.toml").string() + " --checkpoint " + dir.string() +
          " --set model.label_smoothing=0.1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "another model")) << r.err;
}

// A run folder whose checkpoints this config would not pick (another format, or only best.*):
// the error names the file that is there and how to use it, not "train it again".
TEST_F(Cli, ACheckpointOfAnotherKindInARunFolderIsNamed) {
  const auto st = dir_ / "st", best = dir_ / "best";
  ASSERT_EQ(run("train " + quickstart() + " --set run.steps=4 --set checkpoint.format=safetensors" +
                " --run-dir " + st.string())
                .exit_code,
            0);
  auto r = run("eval " + quickstart() + " --checkpoint " + st.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "but step-00000004.safetensors: the run wrote another checkpoint format"))
      << r.err;
  EXPECT_FALSE(has(r.err, "train it again")) << r.err;
  ASSERT_EQ(run("train " + quickstart() +
                " --set run.steps=4 --set run.eval_every=2 --set checkpoint.every=0"
                " --set checkpoint.final=false --set checkpoint.keep_best=eval_loss --run-dir " +
                best.string())
                .exit_code,
            0);
  r = run("eval " + quickstart() + " --checkpoint " + best.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "only its best one (checkpoint.keep_best)")) << r.err;
  EXPECT_TRUE(has(r.err, "--checkpoint " + (best / "checkpoints" / "best.mxt").string())) << r.err;
}

// A longer run.steps on resume keeps the schedule's horizon (the lr of every step it shares with
// the original run is the original's, bit for bit) and says so; run.stretch_schedule re-plans it.
TEST_F(Cli, ResumeWithMoreStepsKeepsTheScheduleHorizonUnlessStretched) {
  const std::string common =
      " --set optimizer.schedule=warmup_cosine --set optimizer.warmup_steps=2"
      " --set run.log_every=1 --set run.eval_every=0 --set checkpoint.every=10";
  const auto full = dir_ / "full";
  ASSERT_EQ(run("train " + quickstart() + common + " --set run.steps=20 --run-dir " + full.string())
                .exit_code,
            0);
  const auto at10 = (full / "checkpoints" / "step-00000010.mxt").string();
  auto lr_by_step = [&](const fs::path& d) {
    std::map<int, double> out;
    for (const auto& j : records(d / "metrics.jsonl"))
      if (j.contains("lr")) out[j["step"].get<int>()] = j["lr"].get<double>();
    return out;
  };
  const auto kept = dir_ / "kept", stretched = dir_ / "stretched";
  auto r = run("train " + quickstart() + common + " --set run.steps=30 --resume " + at10 +
               " --run-dir " + kept.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("keeps the checkpoint's horizon of 20 steps"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("run.stretch_schedule = true"), std::string::npos) << r.err;
  const auto original = lr_by_step(full), k = lr_by_step(kept);
  for (int step = 11; step <= 20; ++step) EXPECT_EQ(k.at(step), original.at(step)) << step;
  EXPECT_EQ(k.at(30), k.at(21)) << "past its horizon the schedule stays at its end";
  r = run("train " + quickstart() + common +
          " --set run.steps=30 --set run.stretch_schedule=true"
          " --resume " +
          at10 + " --run-dir " + stretched.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("re-plans the warmup_cosine schedule over 30 steps"), std::string::npos)
      << r.err;
  const auto st = lr_by_step(stretched);
  EXPECT_GT(st.at(11), original.at(11)) << "a longer cosine is higher at the same step";
  EXPECT_GT(st.at(29), st.at(30));
  // The horizon in use is what the next checkpoint promises: resuming the kept run's last
  // checkpoint with its own run.steps changes nothing and says nothing.
  r = run("train " + quickstart() + common + " --set run.steps=30 --resume " + kept.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "horizon")) << r.err;
  // A schedule without a horizon (step sizes alone) has none to keep: the same lrs, nothing said.
  const std::string stepped =
      " --set optimizer.schedule=step --set optimizer.step_size=3 --set optimizer.gamma=0.5"
      " --set optimizer.warmup_steps=2 --set run.log_every=1 --set run.eval_every=0"
      " --set checkpoint.every=10";
  const auto step_full = dir_ / "step-full", step_more = dir_ / "step-more";
  ASSERT_EQ(
      run("train " + quickstart() + stepped + " --set run.steps=20 --run-dir " + step_full.string())
          .exit_code,
      0);
  r = run("train " + quickstart() + stepped + " --set run.steps=30 --resume " +
          (step_full / "checkpoints" / "step-00000010.mxt").string() + " --run-dir " +
          step_more.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "horizon")) << r.err;
  const auto sf = lr_by_step(step_full), sm = lr_by_step(step_more);
  for (int step = 11; step <= 20; ++step) EXPECT_EQ(sm.at(step), sf.at(step)) << step;
}

// Another schedule on resume (an edited config, a --set) is allowed, but the rate jumps: a warning
// names each changed key and the next step's lr under both schedules, the one the resumed run
// then logs and the one the original run took.
TEST_F(Cli, ResumeWithAnotherScheduleSaysHowTheNextLrChanges) {
  const std::string common =
      " --set optimizer.schedule=warmup_cosine --set optimizer.warmup_steps=2 --set run.steps=20"
      " --set run.log_every=1 --set run.eval_every=0 --set checkpoint.every=10";
  const auto full = dir_ / "full";
  ASSERT_EQ(run("train " + quickstart() + common + " --run-dir " + full.string()).exit_code, 0);
  const auto at10 = (full / "checkpoints" / "step-00000010.mxt").string();
  auto lr_at_step = [&](const fs::path& d, int step) {
    for (const auto& j : records(d / "metrics.jsonl"))
      if (j.contains("lr") && j["step"].get<int>() == step) return j["lr"].get<double>();
    return -1.0;
  };
  auto r = run("train " + quickstart() + common + " --resume " + at10 + " --run-dir " +
               (dir_ / "same").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "learning-rate schedule")) << r.err;
  const auto changed = dir_ / "changed";
  r = run("train " + quickstart() + common +
          " --set optimizer.warmup_steps=15 --set optimizer.adamw.lr=0.01 --resume " + at10 +
          " --run-dir " + changed.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto line = r.err.substr(r.err.find("was trained with another learning-rate schedule"));
  EXPECT_TRUE(has(line, "warmup_steps = 2 -> 15, optimizer.adamw.lr = 0.003 -> 0.01")) << line;
  char rates[96];
  std::snprintf(rates, sizeof rates,
                "next step's lr is %.6g where the checkpoint's schedule "
                "gives %.6g",
                lr_at_step(changed, 11), lr_at_step(full, 11));
  EXPECT_TRUE(has(line, rates)) << line << "\nexpected: " << rates;
  EXPECT_NE(lr_at_step(changed, 11), lr_at_step(full, 11));
}

// Other optimizer or scaler options on resume (Adam's beta2, weight decay, clipping, the dynamic
// scaler's growth interval) are allowed and change the steps from there, so a warning names each;
// the lr is the schedule warning's, and a resume with the run's settings says nothing.
TEST_F(Cli, ResumeWithOtherOptimizerOrScalerOptionsNamesEachChange) {
  const std::string common =
      " --set scaler.type=dynamic --set run.steps=20 --set run.eval_every=0"
      " --set checkpoint.every=10";
  const auto full = dir_ / "full";
  ASSERT_EQ(run("train " + quickstart() + common + " --run-dir " + full.string()).exit_code, 0);
  const auto at10 = (full / "checkpoints" / "step-00000010.mxt").string();
  auto r = run("train " + quickstart() + common + " --resume " + at10 + " --run-dir " +
               (dir_ / "same").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "optimizer or scaler settings")) << r.err;
  r = run("train " + quickstart() + common +
          " --set optimizer.adamw.beta2=0.9 --set optimizer.adamw.weight_decay=0.5"
          " --set optimizer.adamw.lr=0.01 --set optimizer.clip_grad_norm=0.5"
          " --set scaler.dynamic.growth_interval=3 --resume " +
          at10 + " --run-dir " + (dir_ / "changed").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto from = r.err.find("was trained with other optimizer or scaler settings");
  ASSERT_NE(from, std::string::npos) << r.err;
  const auto line = r.err.substr(from, r.err.find('\n', from) - from);
  EXPECT_TRUE(has(line, "optimizer.adamw.beta2 = 0.999 -> 0.9")) << line;
  EXPECT_TRUE(has(line, "optimizer.adamw.weight_decay = 0.01 -> 0.5")) << line;
  EXPECT_TRUE(has(line, "optimizer.clip_grad_norm = 0.0 -> 0.5")) << line;
  EXPECT_TRUE(has(line, "scaler.dynamic.growth_interval = 2000 -> 3")) << line;
  EXPECT_FALSE(has(line, ".lr")) << line;  // the schedule warning's
  EXPECT_TRUE(has(r.err, "optimizer.adamw.lr = ")) << r.err;
  // The starting scale is the checkpoint's (calibrate's --merge file sets init_scale): not said.
  r = run("train " + quickstart() + common + " --set scaler.dynamic.init_scale=1024 --resume " +
          at10 + " --run-dir " + (dir_ / "rescaled").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "optimizer or scaler settings")) << r.err;
}

// --resume RUN without a config continues with the run's own config.toml.
TEST_F(Cli, ResumeOfARunFolderWithoutAConfigUsesTheRunsOwn) {
  const auto dir = dir_ / "run";
  ASSERT_EQ(run("train " + config("gpt-tiny-fp32.toml") +
                " --set run.steps=2 --set run.eval_every=0 --set data.batch_size=2 --run-dir " +
                dir.string())
                .exit_code,
            0);
  // A finished run resumed as it is: evaluated and saved again, with the GPT's own config (the
  // quickstart's MLP would not fit its checkpoint).
  auto r = run("train --resume " + dir.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("the resumed run's own"), std::string::npos) << r.err;
  // A folder without its config.toml, and a path that is not there: each named as it is.
  fs::create_directories(dir_ / "empty");
  r = run("train --resume " + (dir_ / "empty").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("no config.toml in " + (dir_ / "empty").string()), std::string::npos)
      << r.err;
  r = run("train --resume " + (dir_ / "nowhere").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find((dir_ / "nowhere").string() + ": no such run folder or checkpoint"),
            std::string::npos)
      << r.err;
}

// Resuming an earlier checkpoint in its own run folder abandons what came after it: those
// checkpoints move aside with the metrics records, so keep-pruning and a later --resume of the
// folder see only this continuation's.
TEST_F(Cli, ResumingAnEarlierCheckpointInPlaceMovesTheLaterOnesAside) {
  const std::string common =
      " --set run.log_every=10 --set run.eval_every=0"
      " --set checkpoint.keep=3";
  auto dir = dir_ / "run";
  auto r = run("train " + quickstart() + common + " --set run.steps=60 --set checkpoint.every=20" +
               " --run-dir " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto r2 = run("train " + quickstart() + common + " --set run.steps=30 --set checkpoint.every=30" +
                " --resume " + (dir / "checkpoints" / "step-00000020.mxt").string() +
                " --run-dir " + dir.string());
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  auto names = [](const fs::path& folder) {
    std::set<std::string> out;
    for (const auto& f : fs::directory_iterator(folder)) out.insert(f.path().filename().string());
    return out;
  };
  EXPECT_EQ(names(dir / "checkpoints"),
            (std::set<std::string>{"step-00000020.mxt", "step-00000030.mxt"}));
  EXPECT_EQ(names(dir / "checkpoints.discarded-after-step-20"),
            (std::set<std::string>{"step-00000040.mxt", "step-00000060.mxt"}));
  EXPECT_TRUE(fs::exists(dir / "metrics.discarded-after-step-20.jsonl"));
  // Said once, with what moved and where.
  const std::string said = r2.out + r2.err;
  std::ifstream side(dir / "metrics.discarded-after-step-20.jsonl");
  std::int64_t records = 0;
  for (std::string l; std::getline(side, l);) records += l.empty() ? 0 : 1;
  ASSERT_GT(records, 0);
  const std::string line =
      "from after step 20, moved aside: 2 checkpoints to " +
      (dir / "checkpoints.discarded-after-step-20").string() + "/; " + std::to_string(records) +
      " metrics records to " + (dir / "metrics.discarded-after-step-20").string() +
      ".*; summary.json to " + (dir / "summary.discarded-after-step-20.json").string() +
      // run.steps and checkpoint.every differ: the config that trained the steps after 20 too.
      "; the config.toml it last trained with to " +
      (dir / "config.discarded-after-step-20.toml").string() + " (";
  ASSERT_NE(said.find(line), std::string::npos) << said;
  EXPECT_EQ(said.find(line, said.find(line) + 1), std::string::npos) << said;
  // No TensorBoard sink, no events: the line names no folder nothing went into.
  EXPECT_EQ(said.find("TensorBoard"), std::string::npos) << said;
  EXPECT_FALSE(fs::exists(dir / "tensorboard.discarded-after-step-20"));
  // The first run's summary described steps up to 60; the resumed run wrote its own.
  EXPECT_TRUE(fs::exists(dir / "summary.discarded-after-step-20.json"));
  EXPECT_EQ(summary(dir)["steps"], 30) << slurp(dir / "summary.json");
  EXPECT_EQ(nlohmann::json::parse(slurp(dir / "summary.discarded-after-step-20.json"))["steps"],
            60);
  EXPECT_TRUE(has(slurp(dir / "config.discarded-after-step-20.toml"), "steps = 60"));
  // A fresh run says nothing of the kind.
  EXPECT_EQ((r.out + r.err).find("moved aside"), std::string::npos);
}

// checkpoint.final = false: no checkpoint at the end (benchmarks), while checkpoint.every still
// writes its own; the run ends as usual.
TEST_F(Cli, WithoutAFinalCheckpointOnlyThePeriodicOnesAreWritten) {
  auto dir = dir_ / "run";
  auto r = run("train " + quickstart() +
               " --set run.log_every=10 --set run.eval_every=0 --set run.steps=50"
               " --set checkpoint.every=20 --set checkpoint.final=false --run-dir " +
               dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::set<std::string> names;
  for (const auto& f : fs::directory_iterator(dir / "checkpoints"))
    names.insert(f.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"step-00000020.mxt", "step-00000040.mxt"}));
  EXPECT_TRUE(fs::exists(dir / "summary.json"));
  // A periodic step that is also the last is still written.
  auto last = dir_ / "last";
  r = run("train " + quickstart() +
          " --set run.log_every=10 --set run.eval_every=0 --set run.steps=40"
          " --set checkpoint.every=20 --set checkpoint.final=false --run-dir " +
          last.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  names.clear();
  for (const auto& f : fs::directory_iterator(last / "checkpoints"))
    names.insert(f.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"step-00000020.mxt", "step-00000040.mxt"}));
}

// A run resumed at its own run.steps has nothing to train: it says so, how to go on, and leaves
// every file of the finished run as it was (the final checkpoint's metadata included).
TEST_F(Cli, ResumingARunAlreadyAtItsStepsSaysSoAndWritesNothing) {
  const auto dir = dir_ / "done";
  const std::string args = " --set run.steps=20 --set run.log_every=10 --set checkpoint.every=10";
  auto r = run("train " + quickstart() + args + " --run-dir " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto snapshot = [&] {
    std::map<std::string, std::string> files;
    for (const auto& f : fs::recursive_directory_iterator(dir))
      if (f.is_regular_file()) {
        std::ifstream in(f.path(), std::ios::binary);
        files[fs::relative(f.path(), dir).string()] =
            std::string(std::istreambuf_iterator<char>(in), {});
      }
    return files;
  };
  const auto before = snapshot();
  auto again = run("train --resume " + dir.string());
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const std::string said = again.out + again.err;
  EXPECT_NE(said.find("already at step 20 of run.steps = 20"), std::string::npos) << said;
  EXPECT_NE(said.find("--set run.steps=N, N > 20"), std::string::npos) << said;
  EXPECT_NE(said.find("nothing to do"), std::string::npos) << said;
  EXPECT_EQ(snapshot(), before) << "a finished run's files were rewritten";
}

// fp16 gradients without a loss scaler are warned of when training starts, as check does.
TEST_F(Cli, TrainWarnsOfFp16GradientsWithoutALossScaler) {
  const std::string args = " --set run.steps=2 --set precision.policy=fp16-mixed";
  auto none = run("train " + quickstart() + args + " --set scaler.type=none --run-dir " +
                  (dir_ / "none").string());
  ASSERT_EQ(none.exit_code, 0) << none.err;
  const std::string warning = "scaler.type = \"none\": small gradients will flush to zero";
  const std::string said = none.out + none.err;
  ASSERT_NE(said.find(warning), std::string::npos) << said;
  EXPECT_EQ(said.find(warning, said.find(warning) + 1), std::string::npos) << "said once";
  auto scaled = run("train " + quickstart() + args + " --set scaler.type=dynamic --run-dir " +
                    (dir_ / "scaled").string());
  ASSERT_EQ(scaled.exit_code, 0) << scaled.err;
  EXPECT_EQ((scaled.out + scaled.err).find(warning), std::string::npos);
  // Under fp32, an override that computes a node in fp16 makes its gradients fp16 too: the same
  // warning, naming the node, from train and check alike.
  const std::string fp16_head = " --set run.steps=2 --set scaler.type=none";
  write_file("override.toml", "[[precision.override]]\nlayers = \"head\"\ncompute = \"fp16\"\n");
  auto overridden =
      run("train " + quickstart() + fp16_head + " --merge " + (dir_ / "override.toml").string() +
          " --run-dir " + (dir_ / "overridden").string());
  ASSERT_EQ(overridden.exit_code, 0) << overridden.err;
  const std::string names = "makes the gradients of head fp16 but " + warning;
  EXPECT_TRUE(has(overridden.out + overridden.err, names)) << overridden.out << overridden.err;
  auto checked =
      run("check " + quickstart() + fp16_head + " --merge " + (dir_ / "override.toml").string());
  ASSERT_EQ(checked.exit_code, 0) << checked.err;
  EXPECT_TRUE(has(checked.out + checked.err, names)) << checked.out << checked.err;
}

// check rehearses a step on the first batch: a forward that overflows there (overflow-demo.toml
// under fp16, which train then diverges on) is warned of, naming the tensor; a config whose
// first step is finite is not.
TEST_F(Cli, CheckWarnsOfAFirstStepWhoseForwardOverflows) {
  const std::string warning = "the rehearsed first step is not finite in the forward";
  auto r = run("check " + config("overflow-demo.toml") + " --set precision.policy=fp16-mixed");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out + r.err, warning + ", first at forward proj.output")) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "# config OK (with warnings)")) << r.out;
  r = run("check " + config("overflow-demo.toml") + " --set precision.policy=fp32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.out + r.err, warning)) << r.out << r.err;
  // A loss scale too large for the first step overflows the backward, not the forward: the
  // replay runs on the step's own weights, before an update of non-finite gradients (which the
  // optimizer never gets: zeros take its path) could have made them NaN and blamed the forward.
  r = run("check " + quickstart() +
          " --set precision.policy=fp16-mixed --set scaler.type=dynamic"
          " --set scaler.dynamic.init_scale=4294967296");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.out + r.err, warning)) << r.out << r.err;
}

// A run killed before its first checkpoint (a second Ctrl-C) leaves metrics and no checkpoint or
// summary: resuming it says why there is nothing to resume and how to start again, once.
TEST_F(Cli, ResumingARunKilledBeforeItsFirstCheckpointSaysWhy) {
  const auto dir = dir_ / "killed";
  auto r = run("train " + quickstart() + " --set run.steps=20 --set run.log_every=5" +
               " --run-dir " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // What the killed run would have left: its config and metrics, no checkpoint, no summary.
  fs::remove_all(dir / "checkpoints");
  fs::create_directories(dir / "checkpoints");
  fs::remove(dir / "summary.json");
  auto again = run("train --resume " + dir.string());
  EXPECT_EQ(again.exit_code, 2) << again.err;
  const std::string why =
      "logged up to step 20 and ended without finishing, before its first "
      "checkpoint";
  ASSERT_NE(again.err.find(why), std::string::npos) << again.err;
  EXPECT_EQ(again.err.find(why, again.err.find(why) + 1), std::string::npos) << "said once";
  EXPECT_NE(again.err.find("a second Ctrl-C"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("mixtrain train " + (dir / "config.toml").string()), std::string::npos)
      << again.err;
}

// A process an MPI launcher started as rank 1 tags its lines "rank 1" from the first one (before
// any communicator exists) and, as every rank but 0, logs warnings and errors only.
TEST_F(Cli, ALaunchedRankTagsItsLinesFromTheFirst) {
  CliResult r;
  {
    const ScopedEnv size("OMPI_COMM_WORLD_SIZE", "2"), rank("OMPI_COMM_WORLD_RANK", "1");
    r = run("train " + quickstart() +
            " --set run.steps=2 --set optimizer.schedule=multistep"
            " --set optimizer.milestones=[500] --run-dir " +
            (dir_ / "r1").string());
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("[warning] rank 1 [trainer] optimizer.milestones"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("[info]"), std::string::npos) << r.err;
  // Without a launcher: rank 0's lines, untagged.
  auto plain =
      run("train " + quickstart() + " --set run.steps=2 --run-dir " + (dir_ / "r0").string());
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.err.find("[info]"), std::string::npos) << plain.err;
  EXPECT_EQ(plain.err.find("rank 1"), std::string::npos) << plain.err;
  // A config's mistakes, reported together: each error line says the rank.
  {
    const ScopedEnv size("OMPI_COMM_WORLD_SIZE", "2"), rank("OMPI_COMM_WORLD_RANK", "1");
    r = run("train " + quickstart() + " --set run.steps=-3 --set data.batch_size=0 --run-dir " +
            (dir_ / "r2").string());
  }
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("error: rank 1: --set data.batch_size=0:"), std::string::npos) << r.err;
  std::size_t errors = 0;
  for (auto at = r.err.find("error: "); at != std::string::npos; at = r.err.find("error: ", at + 1))
    if (at == 0 || r.err[at - 1] == '\n') {
      ++errors;
      EXPECT_EQ(r.err.compare(at, 15, "error: rank 1: "), 0) << r.err;
    }
  EXPECT_EQ(errors, 2u) << r.err;
}

TEST_F(Cli, CheckPrintsThePlanAndPluginsListsComponents) {
  auto c = run("check " + quickstart());
  ASSERT_EQ(c.exit_code, 0) << c.err;
  // The model summary: a row per node with shapes, parameters, FLOPs and dtypes, then totals.
  EXPECT_NE(c.out.find("# model:"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("head             linear     [128]"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("fp32/fp32/fp32/fp32"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("# totals:"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("planned activation memory"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("config OK"), std::string::npos);
  auto p = run("plugins");
  ASSERT_EQ(p.exit_code, 0) << p.err;
  for (const char* name : {"cpu", "fp32", "none", "static", "dynamic", "sgd", "adamw", "native"})
    EXPECT_NE(p.out.find(name), std::string::npos) << name << "\n" << p.out;
}

TEST_F(Cli, CheckListsWhatTrainsAndABadFreezePatternExits2AtItsLine) {
  auto c = run("check " + quickstart() + " --set 'train.frozen=[\"fc1\", \"fc2.weight\"]'");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_NE(c.out.find("# trainable: "), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("fc2.bias, head.weight, head.bias"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("# frozen: "), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("fc1.weight, fc1.bias, fc2.weight"), std::string::npos) << c.out;
  // Everything trains: no such lines.
  auto plain = run("check " + quickstart());
  EXPECT_EQ(plain.out.find("# frozen: "), std::string::npos) << plain.out;
  auto cfg = write_file("freeze.toml", "[train]\ntrainable = [\"head\", \"fc3\"]\n");
  auto bad = run("check " + quickstart() + " --merge " + cfg.string());
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find(cfg.string() + ":2:22"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("'fc3' matches no parameter"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("the closest: fc1.weight"), std::string::npos) << bad.err;
}

// --merge and --set take one value per flag, so the config path may come after them: it is the
// config, not a second merge file (which trained the embedded quickstart, exit 0); a second value
// after one flag exits 2 saying to repeat the flag.
TEST_F(Cli, OverridesBeforeTheConfigPathTakeOneValueEach) {
  const auto merge = write_file("bf16.toml", "[precision]\npolicy = \"bf16-mixed\"\n");
  const auto run_dir = dir_ / "run";
  // The quickstart (fp32) is small: a config's path and a merged policy are what this checks.
  auto r = run("train --merge " + merge.string() + " --set run.steps=1 " + quickstart() +
               " --set run.eval_every=0 --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto resolved = slurp(run_dir / "config.toml");
  EXPECT_TRUE(has(resolved, "quickstart.toml")) << resolved;
  EXPECT_TRUE(has(resolved, "policy = \"bf16-mixed\"")) << resolved;
  auto c = run("check --merge " + merge.string() + " " + quickstart() + " --skip-rehearsal");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_TRUE(has(c.out, "policy = \"bf16-mixed\"")) << c.out;
  auto two = run("check --set run.steps=2 run.eval_every=0 " + quickstart());
  EXPECT_EQ(two.exit_code, 2);
  EXPECT_TRUE(has(two.err, "--set and --merge take one value each: repeat the flag")) << two.err;
}

// --log-level is accepted after the subcommand too, as users type it last.
TEST_F(Cli, LogLevelAfterTheSubcommand) {
  const std::string train = "train " + quickstart() + " --set run.steps=3 --run-dir ";
  auto info = run(train + (dir_ / "a").string());
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.err.find("[info]"), std::string::npos) << info.err;
  auto quiet = run(train + (dir_ / "b").string() + " --log-level warn");
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("[info]"), std::string::npos) << quiet.err;
  EXPECT_TRUE(fs::exists(dir_ / "b" / "summary.json"));
  // Before the subcommand, as before; an unknown level is bad input either way.
  auto before = run("--log-level warn check " + quickstart());
  EXPECT_EQ(before.exit_code, 0) << before.err;
  EXPECT_EQ(before.err.find("[info]"), std::string::npos) << before.err;
  auto bad = run("check " + quickstart() + " --log-level loud");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("unknown log level 'loud'"), std::string::npos) << bad.err;
}

TEST_F(Cli, VersionAndBadArgumentsExitCodes) {
  auto v = run("--version");
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_NE(v.out.find("mixtrain"), std::string::npos);
  auto bad = run("train --no-such-flag");
  EXPECT_EQ(bad.exit_code, 2);
  // The parser's errors look like every other: "error:" and where to look.
  EXPECT_NE(bad.err.find("error: The following argument was not expected: --no-such-flag"),
            std::string::npos)
      << bad.err;
  EXPECT_NE(bad.err.find("`mixtrain train --help`"), std::string::npos) << bad.err;
  auto none = run("");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("error: A subcommand is required"), std::string::npos) << none.err;
  // A mistyped command is named, with the nearest one and the list.
  auto typo = run("trian x.toml");
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_NE(typo.err.find("'trian' is not a mixtrain command"), std::string::npos) << typo.err;
  EXPECT_NE(typo.err.find("did you mean 'train'?"), std::string::npos) << typo.err;
  // A path the OS refuses (a name over NAME_MAX) is the user's to fix: exit 2 with a hint, not
  // an internal error.
  auto long_name = run("compare " + std::string(300, 'b') + " " + std::string(300, 'c'));
  EXPECT_EQ(long_name.exit_code, 2) << long_name.err;
  EXPECT_NE(long_name.err.find("HINT: check the path"), std::string::npos) << long_name.err;
}

// A repeat typo that would expand to a billion nodes is a config error at the repeat, not an
// allocation failure.
TEST_F(Cli, ABlockRepeatedPastTheNodeLimitExits2AtTheRepeat) {
  const auto cfg = write_file("huge.toml", R"([model]
nodes = [
  { name = "b", block = "deep", inputs = ["input"], repeat = 1000000000 },
  { type = "linear", name = "head", inputs = ["b"], out = 10 },
]
[model.blocks.deep]
inputs = ["x"]
nodes = [ { type = "linear", name = "fc", inputs = ["x"], out = 32 } ]
)");
  auto r = run("check " + cfg.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("huge.toml:3:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("more than 1000000 nodes"), std::string::npos) << r.err;
}

// eval, sample and predict take their weights from --checkpoint: the config's init_from (gone
// since the run started from it) is never opened.
TEST_F(Cli, EvalOfAFinishedRunDoesNotOpenTheConfigsInitFrom) {
  const auto first = dir_ / "first", second = dir_ / "second";
  ASSERT_EQ(
      run("train " + quickstart() + " --set run.steps=2 --run-dir " + first.string()).exit_code, 0);
  const auto init = dir_ / "init.mxt";
  fs::copy_file(first / "checkpoints" / "step-00000002.mxt", init);
  const std::string with_init = quickstart() + " --set checkpoint.init_from=" + init.string();
  ASSERT_EQ(run("train " + with_init + " --set run.steps=2 --run-dir " + second.string()).exit_code,
            0);
  fs::remove(init);
  auto r = run("eval " + with_init + " --checkpoint " + second.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("init.mxt"), std::string::npos) << r.err;
  // `check` opens what training would, so it still says the file is missing.
  r = run("check " + with_init);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("init.mxt"), std::string::npos) << r.err;
}

// `eval` of a checkpoint gives the run's own evaluation of it, bit for bit: with the EMA as the
// weights under eval.weights = "ema", and with delayed FP8 scaling's amax histories (scales of 1
// and the raw weights gave other numbers).
TEST_F(Cli, EvalOfACheckpointIsTheRunsOwnEvaluation) {
  for (const std::string sets : {" --set ema.decay=0.9 --set eval.weights=ema",
                                 " --set precision.policy=fp8-delayed --set scaler.type=dynamic"}) {
    const auto d = dir_ / ("run" + std::to_string(sets.size()));
    ASSERT_EQ(run("train " + quickstart() + sets +
                  " --set run.steps=30 --set run.eval_every=30 --run-dir " + d.string())
                  .exit_code,
              0);
    double trained = 0.0;
    for (const auto& j : records(d / "metrics.jsonl"))
      if (j.contains("eval_loss")) trained = j["eval_loss"].get<double>();
    auto r = run("eval " + (d / "config.toml").string() + " --checkpoint " + d.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto evaluated = json::parse(r.out.substr(r.out.find('{')));
    EXPECT_EQ(evaluated["eval_loss"].get<double>(), trained) << sets;
  }
}

// Without held-out rows, `check` says what evaluation will read instead.
TEST_F(Cli, CheckSaysEvaluationReadsTheTrainingRowsWithoutAHeldOutSplit) {
  auto r = run("check " + quickstart() + " --set data.eval_fraction=0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("no held-out rows (evaluation reads the training rows)"), std::string::npos)
      << r.out;
  // `train` says it too, naming what reads them.
  r = run("train " + quickstart() +
          " --set data.eval_fraction=0 --set run.steps=2 --set checkpoint.keep_best=eval_loss"
          " --set run.eval_every=1 --run-dir " +
          (dir_ / "run").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("no held-out rows (data.eval_fraction = 0 and no eval file): the eval_* "
                       "numbers, early stopping and keep_best read the training rows"),
            std::string::npos)
      << r.err;
}

}  // namespace
