// The block-scaled precision policies (fp8-block, mxfp8, nvfp4) through the real executable on
// the CPU backend's simulator: a tiny MLP trains, an override takes a node out of block scaling,
// an op without a block-scaled path and an option not implemented are refused at plan time
// (exit 2, naming what and the fix), and nvfp4's stochastic rounding repeats exactly with the
// run's seed.
#include "cli_test_support.h"

namespace mixtrain::test {
namespace {

const char* kTinyMlp = R"([run]
name = "tiny"
seed = 3
steps = 3
log_every = 1

[backend]
type = "cpu"

[precision]
policy = "fp32"

[scaler]
type = "none"

[optimizer]
type = "adamw"

[model]
layers = [
  { type = "linear", name = "fc1", out = 40 },
  { type = "relu" },
  { type = "linear", name = "fc2", out = 24 },
  { type = "gelu" },
  { type = "linear", name = "head", out = 10 },
]

[data]
source = "synthetic"
batch_size = 36
eval_fraction = 0.0625

[data.synthetic]
)";

class block_scaled_policies : public CliTest {};

TEST_F(block_scaled_policies, EachPolicyTrainsATinyMlpOnTheCpuSimulator) {
  const auto cfg = write_file("tiny.toml", kTinyMlp);
  std::vector<double> losses;
  for (const char* policy : {"fp8-block", "mxfp8", "nvfp4"}) {
    SCOPED_TRACE(policy);
    const auto r = run(
        "train " + cfg.string() + " --set precision.policy=" + policy + " --set run.name=" + policy,
        dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto recs = records(dir_ / "runs" / policy / "metrics.jsonl");
    ASSERT_FALSE(recs.empty());
    double last = -1.0;
    for (const auto& rec : recs)
      if (rec.contains("loss")) last = rec["loss"].get<double>();
    EXPECT_TRUE(std::isfinite(last) && last > 0.0);
    losses.push_back(last);
  }
  // Three formats of different precision give three different trajectories.
  EXPECT_NE(losses[0], losses[1]);
  EXPECT_NE(losses[1], losses[2]);
}

TEST_F(block_scaled_policies, Nvfp4StochasticRoundingRepeatsWithTheSeedAndChangesWithout) {
  const auto cfg = write_file("tiny.toml", kTinyMlp);
  auto final_loss = [&](const std::string& name, const std::string& extra) {
    const auto r = run("train " + cfg.string() +
                           " --set precision.policy=nvfp4 --set run.name=" + name + " " + extra,
                       dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    double last = -1.0;
    for (const auto& rec : records(dir_ / "runs" / name / "metrics.jsonl"))
      if (rec.contains("loss")) last = rec["loss"].get<double>();
    return last;
  };
  const double a = final_loss("a", ""), b = final_loss("b", "");
  const double rtn = final_loss("rtn", "--set precision.nvfp4.stochastic_rounding=false");
  EXPECT_EQ(a, b);
  EXPECT_NE(a, rtn);
}

TEST_F(block_scaled_policies, AnOverrideTakesANodeOutOfBlockScaling) {
  const auto cfg = write_file("tiny.toml", std::string(kTinyMlp) + R"(
[[precision.override]]
layers = "head"
gemm_input = "bf16"
)");
  const auto r = run("train " + cfg.string() + " --set precision.policy=fp8-block");
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(block_scaled_policies, AnOpWithoutABlockScaledPathIsRefusedAtPlanTimeByName) {
  // The shipped CNN: its convolutions have weight GEMMs but no block-scaled path.
  const auto r = run(
      "train " + config("cnn-small.toml") + " --set precision.policy=fp8-block --set run.steps=1",
      dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "'conv1'") && has(r.err, "gemm_input")) << r.err;
}

TEST_F(block_scaled_policies, AnOptionNotImplementedIsRefusedNamingIt) {
  const auto cfg = write_file("tiny.toml", kTinyMlp);
  const auto r =
      run("train " + cfg.string() +
          " --set precision.policy=nvfp4 --set precision.nvfp4.random_hadamard_transform=true");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "random_hadamard_transform")) << r.err;
}

}  // namespace
}  // namespace mixtrain::test
