// CNNs through the real executable: the shipped small CNN learns its synthetic images under every
// precision policy, `check` lints convolution channels for Tensor Cores, bad convolution and
// pooling geometries exit 2 at plan time naming the node and its config line, and a trained
// CNN's batch-norm statistics are exported with PyTorch's names.
#include <fstream>

#include "cli_test_support.h"

namespace {

using namespace mixtrain::test;
using Cnn = CliTest;

json summary_of(const fs::path& run_dir) {
  std::ifstream in(run_dir / "summary.json");
  return json::parse(in, nullptr, false);
}

TEST_F(Cnn, SmallCnnLearnsItsImagesUnderEveryPolicy) {
  // cnn-small.toml: > 90% held-out accuracy in about half a second of training on two cores.
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"fp32", "none"}, {"bf16-mixed", "none"}, {"fp16-mixed", "dynamic"}, {"fp8-delayed", "none"}};
  for (const auto& [policy, scaler] : runs) {
    const auto run_dir = dir_ / policy;
    auto r = run("train " + config("cnn-small.toml") + " --set precision.policy=" + policy +
                 " --set scaler.type=" + scaler + " --run-dir " + run_dir.string());
    ASSERT_EQ(r.exit_code, 0) << policy << ": " << r.err;
    const json s = summary_of(run_dir);
    ASSERT_TRUE(s.is_object()) << policy;
    EXPECT_GT(s["eval_accuracy"].get<double>(), 0.9) << policy;
    EXPECT_EQ(s["skipped_steps"].get<int>(), 0) << policy;
  }
}

TEST_F(Cnn, CheckWarnsAboutUnalignedConvolutionChannelsUnder16BitPolicies) {
  // The first convolution reads 3 RGB channels: reported, as the usual exception.
  auto r = run("check " + config("resnet20-bf16.toml") + " --set data.synthetic.rows=512");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("'conv1' (conv2d): input channels 3 is not a multiple of 8"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("the usual exception"), std::string::npos) << r.err;
  // Every other convolution of ResNet-20 has 16, 32 or 64 channels.
  EXPECT_EQ(r.err.find("'layer"), std::string::npos) << r.err;
  // FP8 wants multiples of 16; in FP32 nothing is said.
  r = run("check " + config("resnet20-fp32.toml") + " --set data.synthetic.rows=512");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("not a multiple of"), std::string::npos) << r.err;
  // A 12-channel convolution inside the network is named without the exception.
  const auto cfg = write_file("narrow.toml", R"(
[precision]
policy = "bf16-mixed"
[model]
nodes = [
  { type = "conv2d", name = "stem", inputs = ["input"], out = 16, kernel = 3, padding = 1 },
  { type = "conv2d", name = "narrow", inputs = ["stem"], out = 12, kernel = 3, padding = 1 },
  { type = "global_avgpool", name = "gap", inputs = ["narrow"] },
  { type = "linear", name = "fc", inputs = ["gap"], out = 10 },
]
[data]
source = "synthetic"
batch_size = 16
[data.synthetic]
kind = "images"
rows = 256
channels = 1
height = 8
width = 8
)");
  r = run("check " + cfg.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("'narrow' (conv2d): output channels 12 is not a multiple of 8"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("'narrow' (conv2d): output channels 12 is not a multiple of 8; Tensor "
                       "Cores run such shapes padded or not at all (the usual"),
            std::string::npos)
      << r.err;
}

TEST_F(Cnn, BadGeometriesExit2AtPlanTimeNamingTheNodeAndItsLine) {
  const std::string data = R"(
[data]
source = "synthetic"
batch_size = 16
[data.synthetic]
kind = "images"
rows = 256
channels = 3
height = 8
width = 8
)";
  struct Case {
    std::string node, expect;
  };
  const std::vector<Case> cases = {
      {R"({ type = "conv2d", name = "big", inputs = ["input"], out = 8, kernel = 11 })",
       "larger than its padded input"},
      {R"({ type = "conv2d", name = "grouped", inputs = ["input"], out = 8, kernel = 3, groups = 2 })",
       "does not divide"},
      {R"({ type = "conv2d", name = "declared", inputs = ["input"], out = 8, kernel = 3, in = 4 })",
       "but input 'input' has 3 channels"},
      {R"({ type = "maxpool2d", name = "pool", inputs = ["input"], kernel = 2, padding = 2 })",
       "more than half"},
  };
  for (const auto& c : cases) {
    const auto cfg = write_file(
        "bad.toml", "[model]\nnodes = [\n  " + c.node +
                        ",\n  { type = \"global_avgpool\", name = \"gap\", "
                        "inputs = [\"" +
                        c.node.substr(c.node.find("name = \"") + 8,
                                      c.node.find("\", inputs") - c.node.find("name = \"") - 8) +
                        "\"] },\n  { type = \"linear\", name = \"fc\", "
                        "inputs = [\"gap\"], out = 10 },\n]\n" +
                        data);
    auto r = run("train " + cfg.string() + " --run-dir " + (dir_ / "run").string());
    EXPECT_EQ(r.exit_code, 2) << c.node << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("bad.toml:3:"), std::string::npos) << "the node's line\n" << r.err;
    EXPECT_FALSE(fs::exists(dir_ / "run" / "metrics.jsonl")) << "nothing trained";
  }
}

TEST_F(Cnn, BatchNormRunningStatisticsAreExportedWithPyTorchsNames) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + config("cnn-small.toml") + " --set run.steps=20 --run-dir " +
               run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = dir_ / "cnn.safetensors";
  r = run("export " + (run_dir / "checkpoints").string() + " --format safetensors --out " +
          out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The safetensors header is JSON after an 8-byte length.
  std::ifstream in(out, std::ios::binary);
  std::uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  const json h = json::parse(header);
  for (const char* name : {"conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean",
                           "bn1.running_var", "conv2.weight", "bn2.running_var", "fc.weight"})
    EXPECT_TRUE(h.contains(name)) << name << " missing from " << header;
  EXPECT_EQ(h["conv2.weight"]["shape"], json::array({32, 16, 3, 3}));
  EXPECT_EQ(h["bn1.running_var"]["dtype"], "F32");
}

}  // namespace
