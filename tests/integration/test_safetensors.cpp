// Integration tests of safetensors interop through the `mixtrain` executable: `mixtrain export`,
// safetensors files as init weights, and agreement with PyTorch (tests/integration/
// safetensors_interop.py run by Debian's /usr/bin/python3 with torch; skipped without it).
#include <cmath>
#include <cstdlib>
#include <string>

#include "cli_test_support.h"

namespace mixtrain::test {
namespace {

constexpr const char* kPython = "/usr/bin/python3";

bool torch_available() {
  static const bool ok =
      std::system((std::string(kPython) + " -c 'import torch, numpy, tomllib' >/dev/null 2>&1").c_str()) == 0;
  return ok;
}

std::string script() {
  return std::string(MIXTRAIN_CONFIGS_DIR) + "/../tests/integration/safetensors_interop.py";
}

// N = 256 rows, 64 held out: the training split is one full batch of 192.
const char* kInteropConfig = R"(
[run]
name = "interop"
seed = 5
steps = 50
log_every = 1
[backend]
type = "cpu"
threads = 1
[precision]
policy = "fp32"
[scaler]
type = "none"
[optimizer]
type = "sgd"
lr = 0.05
momentum = 0.0
[model]
loss = "softmax_cross_entropy"
layers = [
  { type = "linear", name = "fc1", out = 32 },
  { type = "relu" },
  { type = "linear", name = "fc2", out = 32 },
  { type = "relu" },
  { type = "linear", name = "head", out = 4 },
]
[data]
source = "npy"
features = "x.npy"
labels = "y.npy"
batch_size = 192
shuffle = false
eval_fraction = 0.25
[checkpoint]
fsync = false
)";

class SafetensorsCli : public CliTest {
 protected:
  // Runs the interop script; returns its JSON output (stdout).
  json python(const std::string& args) {
    const auto out = dir_ / "py.out", err = dir_ / "py.err";
    const std::string cmd = std::string(kPython) + " " + script() + " " + args + " >" + out.string() +
                            " 2>" + err.string();
    const int status = std::system(cmd.c_str());
    EXPECT_EQ(status, 0) << slurp(err);
    return json::parse(slurp(out), nullptr, false);
  }

  // npy data written by the script so both sides read identical inputs, and the config.
  fs::path setup_interop() {
    python("data --out " + dir_.string() + " --rows 256 --features 16 --classes 4 --seed 3");
    return write_file("interop.toml", kInteropConfig);
  }

  std::string data_args() const {
    return " --x " + (dir_ / "x.npy").string() + " --y " + (dir_ / "y.npy").string() +
           " --eval-fraction 0.25 --seed 5";
  }
};

// The PyTorch side of the parity tests. GTEST_SKIP in SetUp, not in a helper the test calls: a
// skip inside a helper only returns from the helper, and the test went on and failed.
class TorchInterop : public SafetensorsCli {
 public:
  using SafetensorsCli::data_args;
  using SafetensorsCli::python;
  using SafetensorsCli::records;
  using SafetensorsCli::run;
  const fs::path& dir() const { return dir_; }

 protected:
  void SetUp() override {
    SafetensorsCli::SetUp();
    if (!torch_available())
      GTEST_SKIP() << kPython << " cannot import torch/numpy/tomllib (Debian: apt install "
                   << "python3-torch python3-numpy, or bash cmake/setup-debian.sh --tests); "
                   << "interop not tested";
  }
};

TEST_F(SafetensorsCli, ExportWritesSafetensorsAndRefusesToOverwrite) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + quickstart() + " --set run.steps=5 --set backend.threads=1 --run-dir " +
          run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto ckpt = run_dir / "checkpoints" / "step-00000005.mxt";
  ASSERT_TRUE(fs::exists(ckpt));

  r = run("export " + ckpt.string() + " --format safetensors --dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = run_dir / "step-00000005.safetensors";  // beside the run, not in checkpoints/
  ASSERT_TRUE(fs::exists(out));
  // The header of a safetensors file: 8-byte little-endian length, then that much JSON.
  auto header_of = [](const std::string& bytes) {
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
    EXPECT_LE(n + 8, bytes.size());
    EXPECT_EQ(n % 8, 0u);
    return json::parse(bytes.substr(8, n));
  };
  const auto header = header_of(slurp(out));
  EXPECT_EQ(header["fc1.weight"]["dtype"], "BF16");
  EXPECT_EQ(header["fc1.weight"]["shape"], json::array({128, 32}));
  EXPECT_EQ(header["__metadata__"]["step"], "5");
  EXPECT_EQ(header["__metadata__"]["policy"], "fp32");
  EXPECT_TRUE(header["__metadata__"].contains("mixtrain.version"));
  for (const auto& [k, v] : header.items()) EXPECT_EQ(k.find("optimizer"), std::string::npos) << k;

  // No silent overwrite; --force overwrites.
  r = run("export " + ckpt.string() + " --format safetensors");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("already exists"), std::string::npos) << r.err;
  r = run("export " + ckpt.string() + " --format safetensors --force");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // The fp32 file has other offsets, so its header has another length: read it afresh.
  EXPECT_EQ(header_of(slurp(out))["fc1.weight"]["dtype"], "F32");

  // Bad input: a missing file, an unknown dtype, a damaged checkpoint.
  r = run("export " + (dir_ / "nope.mxt").string() + " --format safetensors");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("nope.mxt does not exist"), std::string::npos) << r.err;
  r = run("export " + ckpt.string() + " --format safetensors --dtype fp8 --out " +
          (dir_ / "x.safetensors").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("'fp8' is not a valid choice"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "x.safetensors"));
  const auto damaged = write_file("damaged.mxt", "MIXTRAIN garbage");
  r = run("export " + damaged.string() + " --format safetensors");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("shorter than the 28-byte preamble"), std::string::npos) << r.err;

  // The exported weights evaluate exactly like the checkpoint they came from (fp32 export).
  const auto config = (run_dir / "config.toml").string();
  auto a = run("eval " + config + " --checkpoint " + ckpt.string());
  auto b = run("eval " + config + " --checkpoint " + out.string());
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(json::parse(a.out)["eval_loss"], json::parse(b.out)["eval_loss"]);
}

// A run may write its own checkpoints as safetensors: weights only, so a resume refuses them at
// once (not late, on a missing optimizer slot), while an export still reads them as mixtrain's
// (format "pt", no training metadata).
TEST_F(SafetensorsCli, ARunsSafetensorsCheckpointsExportButDoNotResume) {
  const auto run_dir = dir_ / "run";
  auto r =
      run("train " + quickstart() +
          " --set run.steps=4 --set checkpoint.format=safetensors --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("train " + quickstart() + " --set run.steps=8 --set checkpoint.format=safetensors" +
          " --resume " + run_dir.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("kept the weights only"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("checkpoint.init_from"), std::string::npos) << r.err;
  const auto out = dir_ / "exported.safetensors";
  r = run("export " + run_dir.string() + " --format safetensors --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string bytes = slurp(out);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  const auto meta = json::parse(bytes.substr(8, n))["__metadata__"];
  EXPECT_EQ(meta["format"], "pt") << meta.dump();
  EXPECT_FALSE(meta.contains("sampler")) << meta.dump();
}

TEST_F(SafetensorsCli, InitFromSafetensorsChecksShapesAndNames) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + quickstart() + " --set run.steps=2 --set backend.threads=1 --run-dir " +
               run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto ckpt = run_dir / "checkpoints" / "step-00000002.mxt";
  const auto weights = dir_ / "w.safetensors";
  ASSERT_EQ(run("export " + ckpt.string() + " --format safetensors --out " + weights.string()).exit_code, 0);

  r = run("train " + quickstart() + " --set run.steps=1 --set checkpoint.init_from=" + weights.string() +
          " --run-dir " + (dir_ / "ok").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("initial weights loaded from"), std::string::npos);

  // Extra tensors in the file (fc2) are reported, not fatal.
  r = run("train " + quickstart() + " --set run.steps=1 --set checkpoint.init_from=" + weights.string() +
          " --set 'model.layers=[{type=\"linear\",name=\"fc1\",out=128},{type=\"relu\"},"
          "{type=\"linear\",name=\"head\",out=10}]' --run-dir " + (dir_ / "extra").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("'fc2.weight' matches no parameter"), std::string::npos) << r.err;

  // A model of another width: the message names the tensor and both shapes.
  r = run("train " + quickstart() + " --set run.steps=1 --set checkpoint.init_from=" + weights.string() +
          " --set 'model.layers=[{type=\"linear\",name=\"fc1\",out=64},{type=\"relu\"},"
          "{type=\"linear\",name=\"head\",out=10}]' --run-dir " + (dir_ / "bad").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("'fc1.weight' has shape [128, 32]"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("expects [64, 32]"), std::string::npos) << r.err;
  // A parameter the file lacks is named.
  r = run("train " + quickstart() + " --set run.steps=1 --set checkpoint.init_from=" + weights.string() +
          " --set 'model.layers=[{type=\"linear\",name=\"first\",out=128},{type=\"relu\"},"
          "{type=\"linear\",name=\"head\",out=10}]' --run-dir " + (dir_ / "missing").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no tensor for parameter 'first.weight'"), std::string::npos) << r.err;
}

TEST_F(TorchInterop, ExportedWeightsReproduceMixtrainEvalInTorch) {
  const auto config = setup_interop();
  const auto run_dir = dir_ / "run";
  auto r = run("train " + config.string() + " --set run.steps=20 --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto ckpt = run_dir / "checkpoints" / "step-00000020.mxt";
  r = run("export " + ckpt.string() + " --format safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto weights = run_dir / "step-00000020.safetensors";

  r = run("eval " + config.string() + " --checkpoint " + ckpt.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto ours = json::parse(r.out);
  // The torch model is built from the run's resolved config.toml.
  const auto theirs = python("loss --config " + (run_dir / "config.toml").string() + " --weights " +
                             weights.string() + data_args());
  ASSERT_TRUE(theirs.is_object());
  EXPECT_EQ(theirs["rows"], ours["rows"]);
  const double a = ours["eval_loss"], b = theirs["loss"];
  EXPECT_LT(std::abs(a - b) / std::abs(b), 1e-5) << "mixtrain " << a << " torch " << b;
  EXPECT_EQ(ours["eval_accuracy"], theirs["accuracy"]);
}

TEST_F(TorchInterop, TorchWeightsInitialiseMixtrainAndEvalMatches) {
  const auto config = setup_interop();
  const auto weights = dir_ / "torch_init.safetensors";
  python("init --config " + config.string() + " --features 16 --seed 11 --out " + weights.string());
  auto r = run("eval " + config.string() + " --checkpoint " + weights.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto ours = json::parse(r.out);
  const auto theirs = python("loss --config " + config.string() + " --weights " + weights.string() + data_args());
  const double a = ours["eval_loss"], b = theirs["loss"];
  EXPECT_LT(std::abs(a - b) / std::abs(b), 1e-5) << "mixtrain " << a << " torch " << b;
}

// Trains `config` for 50 steps in mixtrain and in PyTorch from the same torch-initialised weights
// and the same full batch (`torch_args`: the PyTorch side's optimizer), and expects every step's
// loss to match within 1e-5 relative. Returns mixtrain's losses.
std::vector<double> expect_fifty_steps_match_torch(TorchInterop& t, const fs::path& config,
                                                   const std::string& torch_args,
                                                   const std::string& what) {
  const auto weights = t.dir() / "torch_init.safetensors";
  t.python("init --config " + config.string() + " --features 16 --seed 11 --out " + weights.string());
  const auto run_dir = t.dir() / "run";
  auto r = t.run("train " + config.string() + " --set checkpoint.init_from=" + weights.string() +
                 " --run-dir " + run_dir.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::vector<double> ours;
  for (const auto& rec : TorchInterop::records(run_dir / "metrics.jsonl"))
    if (rec.contains("loss")) ours.push_back(rec["loss"].get<double>());
  const auto theirs = t.python("train --config " + config.string() + " --weights " +
                               weights.string() + " --steps 50 " + torch_args + t.data_args());
  EXPECT_TRUE(theirs.is_object());
  if (!theirs.is_object() || ours.size() != 50u || theirs["losses"].size() != 50u) {
    ADD_FAILURE() << what << ": " << ours.size() << " mixtrain losses, torch said " << theirs.dump();
    return ours;
  }
  double worst = 0.0;
  for (std::size_t i = 0; i < ours.size(); ++i) {
    const double torch_loss = theirs["losses"][i].get<double>();
    const double rel = std::abs(ours[i] - torch_loss) / std::abs(torch_loss);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-5) << what << " step " << i + 1 << ": mixtrain " << ours[i] << " torch "
                         << torch_loss;
  }
  std::printf("max relative loss difference over 50 steps (%s): %.3g\n", what.c_str(), worst);
  ::testing::Test::RecordProperty("max_relative_loss_difference", std::to_string(worst));
  return ours;
}

TEST_F(TorchInterop, FiftySgdStepsMatchTorch) {
  const auto losses =
      expect_fifty_steps_match_torch(*this, setup_interop(), "--lr 0.05", "SGD, sequential MLP");
  ASSERT_FALSE(losses.empty());
  EXPECT_LT(losses.back(), losses.front());  // it learned something
}

// The graph: a residual MLP (x -> fc1 -> relu -> fc2 -> add(x) -> head), 50 AdamW steps in fp32.
TEST_F(TorchInterop, ResidualMlpFiftyAdamWStepsMatchTorch) {
  python("data --out " + dir_.string() + " --rows 256 --features 16 --classes 4 --seed 3");
  std::string text = kInteropConfig;
  const auto optimizer = text.find("[optimizer]");
  const auto data = text.find("[data]");
  text = text.substr(0, optimizer) + R"([optimizer]
type = "adamw"
lr = 0.001
weight_decay = 0.01
[model]
loss = "softmax_cross_entropy"
nodes = [
  { name = "fc1", type = "linear", out = 32, inputs = ["input"] },
  { name = "act", type = "relu", inputs = ["fc1"] },
  { name = "fc2", type = "linear", out = 16, inputs = ["act"] },
  { name = "res", type = "add", inputs = ["fc2", "input"] },
  { name = "head", type = "linear", out = 4, inputs = ["res"] },
]
)" + text.substr(data);
  const auto losses = expect_fifty_steps_match_torch(
      *this, write_file("residual.toml", text), "--lr 0.001 --optimizer adamw --weight-decay 0.01",
      "AdamW, residual MLP");
  ASSERT_FALSE(losses.empty());
  EXPECT_LT(losses.back(), 0.5 * losses.front());  // it learned
}

}  // namespace
}  // namespace mixtrain::test
