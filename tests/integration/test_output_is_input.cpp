// Every command that writes a file (predict, calibrate, export) refuses an output that is one of
// its own inputs, with --force too: exit 2, one error naming the flag, the input and the fix, and
// the input left as it was. A symlink to an input is that input; a new file is never one. Nor
// does --force replace a file that is not a regular one (a FIFO) or a symbolic link.
#include <sys/stat.h>

#include <random>

#include "cli_test_support.h"
#include "npy_test_support.h"

namespace mixtrain::test {
namespace {

const char* kMlp = R"(
[run]
name = "mlp"
seed = 3
steps = 2
[backend]
type = "cpu"
threads = 1
[precision]
policy = "fp32"
[optimizer]
type = "adamw"
[model]
layers = [ { type = "linear", out = 4 }, { type = "relu" }, { type = "linear", out = 3 } ]
[data]
source = "npy"
batch_size = 8
eval_fraction = 0.0
[data.npy]
features = "x.npy"
labels = "y.npy"
[checkpoint]
fsync = false
)";

class OutputIsInput : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    std::mt19937 rng(1);
    std::normal_distribution<float> noise(0.0f, 1.0f);
    std::vector<float> x;
    std::vector<std::int64_t> y;
    for (int r = 0; r < 24; ++r) {
      y.push_back(r % 3);
      for (int f = 0; f < 4; ++f) x.push_back(noise(rng));
    }
    write_npy(dir_ / "x.npy", "<f4", {24, 4}, x);
    write_npy(dir_ / "y.npy", "<i8", {24}, y);
    cfg_ = write_file("mlp.toml", kMlp).string();
    write_file("merge.toml", "[run]\nseed = 4\n");
  }

  // Runs `args` and expects a run's record refused as its --out: exit 2 saying `what` and the
  // fix, and `record` as it was (absent if it was).
  void expect_record_refused(const std::string& args, const fs::path& record,
                             const std::string& what) {
    const bool existed = fs::exists(record);
    const std::string before = existed ? slurp(record) : std::string();
    const auto r = run(args, dir_);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, what)) << args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "write it elsewhere, e.g. beside the run")) << args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "--force or not")) << r.err;
    EXPECT_EQ(fs::exists(record), existed) << record << " by: " << args;
    if (existed) {
      EXPECT_EQ(slurp(record), before) << record << " was overwritten by: " << args;
    }
  }

  // Runs `args` and expects the refusal: exit 2, the input named, the fix, `input` unchanged.
  void expect_refused(const std::string& args, const std::string& input_argument,
                      const fs::path& input) {
    const std::string before = slurp(input);
    ASSERT_FALSE(before.empty()) << input;
    const auto r = run(args, dir_);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "is the input " + input_argument)) << args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "choose another --out")) << r.err;
    EXPECT_TRUE(has(r.err, "--force or not")) << r.err;
    EXPECT_EQ(slurp(input), before) << input << " was overwritten by: " << args;
  }

  fs::path newest_checkpoint(const fs::path& run_dir) {
    fs::path newest;
    for (const auto& e : fs::directory_iterator(run_dir / "checkpoints"))
      if (e.path().extension() == ".mxt" && e.path() > newest) newest = e.path();
    return newest;
  }

  std::string cfg_;
};

TEST_F(OutputIsInput, PredictRefusesEachOfItsInputsWithForce) {
  ASSERT_EQ(run("train " + cfg_ + " --run-dir run", dir_).exit_code, 0);
  const fs::path ckpt = newest_checkpoint(dir_ / "run");
  ASSERT_FALSE(ckpt.empty());
  const std::string base = "predict " + cfg_ + " --merge merge.toml --input x.npy --labels y.npy ";
  // The newest checkpoint of the run folder --checkpoint names, known only once resolved: refused
  // before that as one of the run's checkpoints/ (EveryCommandRefusesTheRecordsOfTheRunItReads).
  const std::string newest = slurp(ckpt);
  auto refused = run(base + "--checkpoint run --force --out " + ckpt.string(), dir_);
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_TRUE(has(refused.err, "is in the checkpoints/ folder of the run run")) << refused.err;
  EXPECT_EQ(slurp(ckpt), newest);
  expect_refused(base + "--checkpoint " + ckpt.string() + " --force --out " + ckpt.string(),
                 "--checkpoint", ckpt);
  expect_refused(base + "--checkpoint run --force --out x.npy", "--input", dir_ / "x.npy");
  expect_refused(base + "--checkpoint run --force --out y.npy", "--labels", dir_ / "y.npy");
  expect_refused(base + "--checkpoint run --force --out mlp.toml", "config", cfg_);
  expect_refused(base + "--checkpoint run --force --out merge.toml", "--merge",
                 dir_ / "merge.toml");
  // Through a symlink, and without --force: the same refusal, not "already exists".
  fs::create_symlink(dir_ / "y.npy", dir_ / "link.npy");
  expect_refused(base + "--checkpoint run --out link.npy", "--labels", dir_ / "y.npy");
  // A new file is no input.
  const auto r = run(base + "--checkpoint run --out p.npy", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(OutputIsInput, CalibrateRefusesItsConfigAndMergeFilesWithForce) {
  const std::string base = "calibrate " + cfg_ + " --merge merge.toml --steps 1 --force ";
  expect_refused(base + "--out merge.toml", "--merge", dir_ / "merge.toml");
  expect_refused(base + "--out mlp.toml", "config", cfg_);
  // The default output, <config name>.precision.toml here, given as a --merge file too.
  write_file("mlp.precision.toml", "[precision]\npolicy = \"fp32\"\n");
  expect_refused("calibrate " + cfg_ + " --merge mlp.precision.toml --steps 1 --force", "--merge",
                 dir_ / "mlp.precision.toml");
}

TEST_F(OutputIsInput, ExportRefusesItsCheckpointConfigAndInitFromWithForce) {
  ASSERT_EQ(run("train " + cfg_ + " --run-dir run", dir_).exit_code, 0);
  const fs::path ckpt = newest_checkpoint(dir_ / "run");
  expect_refused("export " + ckpt.string() + " --format safetensors --force --out " + ckpt.string(),
                 "source", ckpt);
  expect_refused("export run --format safetensors --force --out " + ckpt.string(), "source", ckpt);
  expect_refused("export " + cfg_ + " --initial --format safetensors --force --out mlp.toml",
                 "config", cfg_);
  // checkpoint.init_from is read too: known once the config is.
  auto r = run("export " + cfg_ + " --initial --format safetensors --out init.safetensors", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_refused("export " + cfg_ +
                     " --initial --set checkpoint.init_from=init.safetensors --format "
                     "safetensors --force --out init.safetensors",
                 "checkpoint.init_from", dir_ / "init.safetensors");
}

// The run folder a command reads from keeps its own records, --force or not: its config.toml
// (which train --resume and predict read), summary.json, metrics.jsonl and anything in
// checkpoints/ are refused as an --out, exit 2 with the fix, and left as they were; the run
// resumes after. Beside them, in the run folder, an export is written as before.
TEST_F(OutputIsInput, EveryCommandRefusesTheRecordsOfTheRunItReadsWithForce) {
  ASSERT_EQ(run("train " + cfg_ + " --run-dir run", dir_).exit_code, 0);
  const fs::path run_dir = dir_ / "run";
  const std::string safetensors = "export run --format safetensors --force --out ";
  for (const char* record : {"config.toml", "summary.json", "metrics.jsonl"})
    expect_record_refused(safetensors + "run/" + record, run_dir / record,
                          "is the run run's own " + std::string(record));
  // Another name in checkpoints/ (the run's rotation and newest-checkpoint lookups own it), and
  // a trailing separator or ./ spelling of the same run.
  expect_record_refused(safetensors + "run/checkpoints/step-00000099.safetensors",
                        run_dir / "checkpoints" / "step-00000099.safetensors",
                        "checkpoints/ folder of the run");
  expect_record_refused(
      "export run/checkpoints/ --format safetensors --force --out ./run/summary.json",
      run_dir / "summary.json", "own summary.json");
  // predict reads the run through --checkpoint, or through its config; calibrate and export
  // --initial through the config.
  const std::string predict = "predict " + cfg_ + " --checkpoint run --input x.npy --force --out ";
  expect_record_refused(predict + "run/metrics.jsonl", run_dir / "metrics.jsonl",
                        "own metrics.jsonl");
  expect_record_refused(
      "predict " + cfg_ +
          " --checkpoint run/checkpoints/ --input x.npy --force --out run/config.toml",
      run_dir / "config.toml", "is the run run's own config.toml");
  expect_record_refused(
      "predict run/config.toml --checkpoint run --input x.npy --force --out run/summary.json",
      run_dir / "summary.json", "own summary.json");
  expect_record_refused("calibrate run/config.toml --steps 1 --force --out run/summary.json",
                        run_dir / "summary.json", "own summary.json");
  expect_record_refused(
      "export run/config.toml --initial --force --out run/checkpoints/init.safetensors",
      run_dir / "checkpoints" / "init.safetensors", "checkpoints/ folder of the run");
  auto r = run("train --resume run --set run.steps=3", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // Beside the records: written.
  r = run(safetensors + "run/weights.safetensors", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run(predict + "run/predictions.npy", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Another run's records are refused too, though the command reads nothing of that run: a
// checkpoint dropped into its checkpoints/ (without --force: a new file) would be the one
// `train --resume OTHER` takes, and --force over its config.toml would replace the config it
// resumes with. A folder a run wrote only its config.toml into (stopped before its first
// checkpoint) is a run; a folder holding a config.toml of the user's and a checkpoints/ folder
// is not.
TEST_F(OutputIsInput, EveryCommandRefusesTheRecordsOfAnotherRunWithForce) {
  ASSERT_EQ(run("train " + cfg_ + " --run-dir src", dir_).exit_code, 0);
  ASSERT_EQ(run("train " + cfg_ + " --run-dir other", dir_).exit_code, 0);
  const fs::path other = dir_ / "other";
  expect_record_refused("export src --format native --out other/checkpoints/step-00000999.mxt",
                        other / "checkpoints" / "step-00000999.mxt",
                        "checkpoints/ folder of the run other");
  expect_record_refused("export src --format safetensors --force --out other/config.toml",
                        other / "config.toml", "is the run other's own config.toml");
  expect_record_refused(
      "export src --format safetensors --force --out ./other/../other/summary.json",
      other / "summary.json", "own summary.json");
  expect_record_refused(
      "predict " + cfg_ + " --checkpoint src --input x.npy --force --out other/metrics.jsonl",
      other / "metrics.jsonl", "is the run other's own metrics.jsonl");
  expect_record_refused("calibrate " + cfg_ + " --steps 1 --force --out other/summary.json",
                        other / "summary.json", "own summary.json");
  // A run stopped before anything but its config.toml.
  fs::create_directories(dir_ / "started" / "checkpoints");
  fs::copy_file(other / "config.toml", dir_ / "started" / "config.toml");
  expect_record_refused("export src --format native --out started/checkpoints/x.mxt",
                        dir_ / "started" / "checkpoints" / "x.mxt",
                        "checkpoints/ folder of the run started");
  // The run is as it was: it continues.
  auto r = run("train --resume other --set run.steps=3", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // Beside its records, and into a folder that holds no run: written.
  r = run("export src --format safetensors --out other/weights.safetensors", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  fs::create_directories(dir_ / "mine" / "checkpoints");
  write_file("mine/config.toml", "[run]\nseed = 4\n");
  r = run("export src --format safetensors --force --out mine/config.toml", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run("export src --format native --out mine/checkpoints/x.mxt", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A device, a FIFO or a socket is never replaced, --force or not: the writers rename a new file
// into place (as root, over /dev/null, the system's). Refused before any work, the FIFO left as it
// was; the same for a file of an --layout hf folder.
TEST_F(OutputIsInput, EveryCommandRefusesToReplaceAFifoWithForce) {
  ASSERT_EQ(::mkfifo((dir_ / "pipe").c_str(), 0644), 0);
  ASSERT_EQ(run("train " + cfg_ + " --run-dir run", dir_).exit_code, 0);
  const std::string ckpt = newest_checkpoint(dir_ / "run").string();
  for (const std::string& args :
       {"calibrate " + cfg_ + " --steps 1 --force --out pipe",
        "predict " + cfg_ + " --checkpoint run --input x.npy --force --out pipe",
        "export " + ckpt + " --format safetensors --force --out pipe"}) {
    const auto r = run(args, dir_);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "pipe is not a regular file")) << args << "\n" << r.err;
    EXPECT_TRUE(fs::is_fifo(dir_ / "pipe")) << args;
  }
  // Nor a symbolic link (as /dev/stdout is one): the rename would replace the link.
  write_file("target.npy", "kept");
  fs::create_symlink(dir_ / "target.npy", dir_ / "alias.npy");
  auto linked =
      run("predict " + cfg_ + " --checkpoint run --input x.npy --force --out alias.npy", dir_);
  EXPECT_EQ(linked.exit_code, 2) << linked.err;
  EXPECT_TRUE(has(linked.err, "alias.npy is a symbolic link")) << linked.err;
  EXPECT_TRUE(fs::is_symlink(dir_ / "alias.npy"));
  EXPECT_EQ(slurp(dir_ / "target.npy"), "kept");
  const std::string gpt = config("gpt-tiny-fp32.toml");
  fs::create_directories(dir_ / "hf");
  ASSERT_EQ(::mkfifo((dir_ / "hf" / "config.json").c_str(), 0644), 0);
  const auto r = run("export " + gpt + " --initial --layout hf --force --out hf", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "config.json is not a regular file")) << r.err;
  EXPECT_TRUE(fs::is_fifo(dir_ / "hf" / "config.json"));
}

// --layout hf writes a folder: its model.safetensors is refused when it is what the command reads
// (a GPT started from that folder's weights, re-exported into the folder).
TEST_F(OutputIsInput, HfFolderExportRefusesTheFolderItReadsWithForce) {
  const std::string gpt = config("gpt-tiny-fp32.toml");
  auto r = run("export " + gpt + " --initial --layout hf --out hf", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_refused("export " + gpt +
                     " --initial --set checkpoint.init_from=hf/model.safetensors"
                     " --set checkpoint.init_layout=gpt2 --layout hf --force --out hf",
                 "checkpoint.init_from", dir_ / "hf" / "model.safetensors");
  // A run started from that folder, exported back over it: the base its adapters or later
  // exports name would change under them.
  r = run("train " + gpt +
              " --set run.steps=1 --set checkpoint.init_from=hf/model.safetensors"
              " --set checkpoint.init_layout=gpt2 --run-dir tuned",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_refused("export tuned --layout hf --force --out hf", "checkpoint.init_from (the run's)",
                 dir_ / "hf" / "model.safetensors");
}

}  // namespace
}  // namespace mixtrain::test
