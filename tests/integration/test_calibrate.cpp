// `mixtrain calibrate` through the real executable: the underflow demo under fp16-mixed (its early
// layers' gradients sit near 1e-10..1e-12, so a loss scale must be recommended), an input past
// fp16's max (that node is pinned to fp32), the same file from two runs, and bad input (exit 2
// with a message naming what is wrong, nothing written).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_test_support.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/sdk/options.h"
#include "npy_test_support.h"

namespace mixtrain::test {
namespace {

// The node column of the calibration table: its first word on each line between the header and
// the blank line that ends it.
std::set<std::string> table_nodes(const std::string& out) {
  std::set<std::string> nodes;
  std::istringstream in(out);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line.rfind("node ", 0) == 0 && line.find("tensor") != std::string::npos) {
      inside = true;
      continue;
    }
    if (!inside) continue;
    if (line.empty()) break;
    nodes.insert(line.substr(0, line.find(' ')));
  }
  return nodes;
}

std::string string_option(const core::Config& c, const std::string& table, const std::string& key) {
  // [precision] may hold `override = [...]`: an array, read elsewhere.
  for (const auto& o : c.table_options(table, {"override"}))
    if (o.key == key) return std::get<std::string>(o.value);
  return {};
}

// A convolution, a ReLU, a global pool and a linear head on 8x8 synthetic images.
std::string tiny_cnn(int steps, const std::string& policy) {
  return "[run]\nsteps = " + std::to_string(steps) + "\n[precision]\npolicy = \"" + policy +
         "\"\n" + R"([model]
nodes = [
  { type = "conv2d", name = "conv", inputs = ["input"], out = 4, kernel = 3, padding = 1 },
  { type = "relu", name = "act", inputs = ["conv"] },
  { type = "global_avgpool", name = "gap", inputs = ["act"] },
  { type = "linear", name = "head", inputs = ["gap"], out = 2 },
]
[data]
source = "synthetic"
batch_size = 16
[data.synthetic]
kind = "images"
rows = 64
channels = 1
height = 8
width = 8
num_classes = 2
)";
}

class Calibrate : public CliTest {
 protected:
  const std::string demo_ = config("underflow-demo.toml");
};

TEST_F(Calibrate, UnderflowDemoUnderFp16RecommendsALossScale) {
  const auto out = dir_ / "demo.toml";
  const auto r = run("calibrate " + demo_ +
                     " --steps 5 --set precision.policy=fp16-mixed --output " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The table: a header, one line per op and tensor, every node of the model.
  EXPECT_TRUE(has(r.out, "calibration: 5 FP32 steps")) << r.out;
  const auto nodes = table_nodes(r.out);
  for (const std::string n : {"fc1", "relu1", "fc20", "relu20", "head"})
    EXPECT_TRUE(nodes.count(n)) << n << " missing from\n" << r.out;
  EXPECT_EQ(nodes.size(), 41u) << r.out;  // 21 linears, 20 relus
  // The first layers' gradients flush in fp16 unscaled: the demo's premise, measured.
  bool early_flush = false;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("relu1 ", 0) == 0 && has(line, "activation_grad") && has(line, "flush"))
      early_flush = true;
  EXPECT_TRUE(early_flush) << r.out;
  EXPECT_TRUE(has(r.out, "mixtrain train " + demo_ + " --merge " + out.string())) << r.out;

  // The file parses and recommends a dynamic scaler whose initial scale is the power of two the
  // table used.
  const auto rec = core::Config::from_file(out);
  EXPECT_EQ(string_option(rec, "precision", "policy"), "fp16-mixed");
  EXPECT_EQ(string_option(rec, "scaler", "type"), "dynamic");
  double init_scale = 0.0;
  for (const auto& o : rec.table_options("scaler.dynamic"))
    if (o.key == "init_scale") init_scale = std::get<double>(o.value);
  int exponent = 0;
  ASSERT_EQ(std::frexp(init_scale, &exponent), 0.5) << "not a power of two: " << init_scale;
  EXPECT_GE(exponent - 1, 1);
  EXPECT_LE(exponent - 1, 24);
  EXPECT_TRUE(has(r.out, "fp16@2^" + std::to_string(exponent - 1))) << r.out;
  // Every override, if any, names a node of the model.
  for (const auto& entry : rec.table_array("precision.override"))
    for (const auto& o : entry.options)
      if (o.key == "layers") {
        EXPECT_TRUE(nodes.count(std::get<std::string>(o.value)));
      }
  // Nothing else was written: no run folder.
  EXPECT_FALSE(fs::exists(dir_ / "runs"));
  // The config takes the file: `check --merge` plans the model with it.
  const auto checked = run("check " + demo_ + " --merge " + out.string());
  ASSERT_EQ(checked.exit_code, 0) << checked.err;
  EXPECT_TRUE(has(checked.out, "# precision policy: fp16-mixed")) << checked.out;
  EXPECT_TRUE(has(checked.out, "init_scale = " + sdk::option_value_to_string(init_scale)))
      << checked.out;
}

// A config whose [scaler.dynamic] bounds the scale (here with no scaler of its own: the file
// turns the dynamic one on) gets an init_scale within them, so the merged config trains; the
// uncapped 2^24 was refused at the config's max_scale line.
TEST_F(Calibrate, TheInitScaleStaysWithinTheConfigsScaleBounds) {
  const auto out = dir_ / "bounded.toml";
  const std::string bounded = " --set scaler.type=none --set scaler.dynamic.max_scale=65536";
  auto r = run("calibrate " + demo_ + " --steps 5 --set precision.policy=fp16-mixed" + bounded +
               " --output " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "capped by the config's [scaler.dynamic] max_scale = 65536")) << r.out;
  double init_scale = 0.0;
  for (const auto& o : core::Config::from_file(out).table_options("scaler.dynamic"))
    if (o.key == "init_scale") init_scale = std::get<double>(o.value);
  EXPECT_EQ(init_scale, 65536.0);
  r = run("train " + demo_ + " --set scaler.dynamic.max_scale=65536 --merge " + out.string() +
          " --set run.steps=2 --run-dir " + (dir_ / "bounded-run").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(Calibrate, AnInputPastFp16sMaxPinsItsNodeToFp32) {
  // Features in ±1, except the first feature of every 16th row: 70000, past fp16's max of 65504,
  // which the fp16 GEMM input of the first linear cannot hold.
  std::vector<float> x;
  std::vector<std::int64_t> y;
  std::uint32_t state = 7;
  for (int i = 0; i < 256 * 8; ++i) {
    state = state * 1664525u + 1013904223u;
    x.push_back(i % (16 * 8) == 0 ? 70000.0f : static_cast<float>(state >> 8) / 8388608.0f - 1.0f);
  }
  for (int i = 0; i < 256; ++i) y.push_back(i % 4);
  write_npy(dir_ / "x.npy", "<f4", {256, 8}, x);
  write_npy(dir_ / "y.npy", "<i8", {256}, y);
  const auto cfg = write_file("big.toml", R"([run]
steps = 20
[precision]
policy = "fp16-mixed"
[model]
layers = [
  { type = "linear", name = "wide_in", out = 16 },
  { type = "relu", name = "act" },
  { type = "linear", name = "head", out = 4 },
]
[data]
source = "npy"
batch_size = 32
[data.npy]
features = "x.npy"
labels = "y.npy"
)");
  const auto out = dir_ / "big.precision.toml";
  const auto r = run("calibrate " + cfg.string() + " --steps 2", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(fs::exists(out)) << "default output is <config stem>.precision.toml here";
  const auto rec = core::Config::from_file(out);
  std::map<std::string, std::string> compute;  // layers -> compute, per override
  for (const auto& entry : rec.table_array("precision.override")) {
    std::string layers, dtype;
    for (const auto& o : entry.options) {
      if (o.key == "layers") layers = std::get<std::string>(o.value);
      if (o.key == "compute") dtype = std::get<std::string>(o.value);
    }
    EXPECT_TRUE(layers == "wide_in" || layers == "act" || layers == "head") << layers;
    compute[layers] = dtype;
  }
  EXPECT_EQ(compute["wide_in"], "fp32") << slurp(out);
  // The comment gives the measured reason.
  EXPECT_TRUE(has(slurp(out), "# wide_in: fp16 -> fp32: fp16: gemm_input saturates")) << slurp(out);
  // The overrides name real nodes: the plan under `check --merge` takes every one of them.
  const auto checked = run("check " + cfg.string() + " --merge " + out.string(), dir_);
  ASSERT_EQ(checked.exit_code, 0) << checked.err;
  EXPECT_TRUE(has(checked.out, "layers = \"wide_in\"")) << checked.out;

  // A node whose name holds a glob's characters is written as that name alone (r\[1\] matches
  // "r[1]" only, a glob "r[1]" would match "r1" and not itself), and train takes it.
  std::string text = slurp(cfg);
  const auto at = text.find("name = \"wide_in\"");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 16, "name = \"wide[in]\"");
  const auto bracket = write_file("bracket.toml", text);
  const auto bracket_out = dir_ / "bracket.precision.toml";
  ASSERT_EQ(run("calibrate " + bracket.string() + " --steps 2", dir_).exit_code, 0);
  EXPECT_TRUE(has(slurp(bracket_out), "layers = \"wide\\\\[in\\\\]\"")) << slurp(bracket_out);
  const auto trained = run("check " + bracket.string() + " --merge " + bracket_out.string(), dir_);
  EXPECT_EQ(trained.exit_code, 0) << trained.err;
}

// policy = "auto" is written as the policy it chose on this backend (the one the rules judged),
// and --set arguments of keys the file sets are named to be left out, the others to be repeated.
TEST_F(Calibrate, AutoIsWrittenAsItsChoiceAndTheSetsTheFileUndoesAreNamed) {
  const auto out = dir_ / "auto.toml";
  const auto r = run("calibrate " + demo_ +
                         " --steps 2 --set precision.policy=auto --set run.seed=9"
                         " --set scaler.dynamic.growth_interval=100 --out " +
                         out.string(),
                     dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto chose = r.err.find("auto policy chose ");
  ASSERT_NE(chose, std::string::npos) << r.err;
  const std::string chosen = r.err.substr(chose + 18, r.err.find(':', chose) - chose - 18);
  EXPECT_EQ(string_option(core::Config::from_file(out), "precision", "policy"), chosen);
  EXPECT_TRUE(has(r.out, "leave out --set 'precision.policy=auto'")) << r.out;
  // A scaler key the file does not write stays the config's on merge: repeated, not left out.
  EXPECT_TRUE(has(r.out,
                  "give train --set 'run.seed=9' --set "
                  "'scaler.dynamic.growth_interval=100' too"))
      << r.out;
}

// Weights 1e20 times their init make the FP32 run itself overflow: every step is skipped (or,
// with run.on_nonfinite = "stop", the run stops at the first). Ranges of NaN and inf recommend
// nothing: exit 2 saying so, and no file.
TEST_F(Calibrate, AnFp32RunThatDoesNotStayFiniteRecommendsNothing) {
  const auto cfg = write_file("inf.toml", R"([run]
steps = 20
[precision]
policy = "fp16-mixed"
[model]
layers = [
  { type = "linear", name = "fc1", out = 16, scale = 1e20 },
  { type = "relu" },
  { type = "linear", name = "fc2", out = 16, scale = 1e20 },
  { type = "relu" },
  { type = "linear", name = "head", out = 4 },
]
[data]
source = "synthetic"
batch_size = 32
[data.synthetic]
rows = 256
features = 8
num_classes = 4
)");
  const auto out = dir_ / "inf.precision.toml";
  auto r = run("calibrate " + cfg.string() + " --steps 3", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "did not stay finite: 3 of its 3 steps had non-finite gradients"))
      << r.err;
  EXPECT_FALSE(fs::exists(out));
  r = run("calibrate " + cfg.string() + " --steps 3 --set run.on_nonfinite=stop", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "stopped after step 1 of 3")) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

// Inputs in ±1 except every 16th row, 1e5 times larger: FP8 with one scale per tensor flushes
// the ordinary rows of every GEMM input, 1x128 blocks keep each row to itself. Under fp8-current
// the report shows the reduction and the file names fp8-block; a convolution in the model keeps
// it from being named.
class CalibrateBlocks : public Calibrate {
 protected:
  std::filesystem::path outlier_config(const std::string& policy, const std::string& layers) {
    std::vector<float> x;
    std::vector<std::int64_t> y;
    std::uint32_t state = 3;
    for (int i = 0; i < 256 * 16; ++i) {
      state = state * 1664525u + 1013904223u;
      const float v = static_cast<float>(state >> 8) / 8388608.0f - 1.0f;
      x.push_back((i / 16) % 16 == 0 ? v * 1e5f : v);
    }
    for (int i = 0; i < 256; ++i) y.push_back(i % 4);
    write_npy(dir_ / "x.npy", "<f4", {256, 16}, x);
    write_npy(dir_ / "y.npy", "<i8", {256}, y);
    return write_file(policy + ".toml", R"([run]
steps = 20
[precision]
policy = ")" + policy + R"("
[optimizer]
type = "adamw"
[model]
layers = [
)" + layers + R"(
]
[data]
source = "npy"
batch_size = 32
[data.npy]
features = "x.npy"
labels = "y.npy"
)");
  }
};

TEST_F(CalibrateBlocks, AnOutlierRowUnderFp8NamesFp8Block) {
  const auto cfg =
      outlier_config("fp8-current", R"(  { type = "linear", name = "wide_in", out = 32 },
  { type = "relu", name = "act" },
  { type = "linear", name = "head", out = 4 },)");
  const auto out = dir_ / "blocks.precision.toml";
  const auto r = run("calibrate " + cfg.string() + " --steps 2 --output " + out.string(), dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "block scaling, 2 sampled steps")) << r.out;
  // The table's line for the first GEMM input in fp8-block: flushed per tensor, not per block.
  bool reduced = false;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("wide_in ", 0) == 0 && has(line, "gemm_input") &&
        has(line, "fp8-block (e4m3)")) {
      std::istringstream cells(line);
      std::vector<std::string> words;
      for (std::string w; cells >> w;) words.push_back(w);
      // node tensor format (elem) flush N% ok reduction
      ASSERT_GE(words.size(), 7u) << line;
      EXPECT_EQ(words[4], "flush") << line;
      EXPECT_EQ(words[6], "ok") << line;
      reduced = words[7] != "-" && words[7] != "worse";
    }
  EXPECT_TRUE(reduced) << r.out;
  EXPECT_TRUE(has(r.out, "block policy: policy fp8-block: fp8-current raises wide_in off fp8"))
      << r.out;
  // The file names the block policy, with the machine-readable counts as comments.
  const std::string text = slurp(out);
  EXPECT_TRUE(has(text, "# block wide_in gemm_input fp8-block nonzero=")) << text;
  EXPECT_TRUE(has(text, " per_block_flushed=0 ")) << text;
  const auto rec = core::Config::from_file(out);
  EXPECT_EQ(string_option(rec, "precision", "policy"), "fp8-block") << text;
  EXPECT_TRUE(rec.table_array("precision.override").empty()) << text;
  // The config takes the file: fp8-block plans the model on this backend.
  const auto checked = run("check " + cfg.string() + " --merge " + out.string(), dir_);
  ASSERT_EQ(checked.exit_code, 0) << checked.err;
  EXPECT_TRUE(has(checked.out, "# precision policy: fp8-block")) << checked.out;

  // Calibrating under fp8-block itself judges the GEMMs per block: nothing is raised.
  const auto under_block =
      outlier_config("fp8-block", R"(  { type = "linear", name = "wide_in", out = 32 },
  { type = "relu", name = "act" },
  { type = "linear", name = "head", out = 4 },)");
  const auto out2 = dir_ / "under_block.toml";
  const auto b =
      run("calibrate " + under_block.string() + " --steps 2 --output " + out2.string(), dir_);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto rec2 = core::Config::from_file(out2);
  EXPECT_EQ(string_option(rec2, "precision", "policy"), "fp8-block");
  EXPECT_TRUE(rec2.table_array("precision.override").empty()) << slurp(out2);
}

// The configured block policy is measured with its own options, not its defaults: mxfp8's OCP
// scale rule (floor) puts a block's amax in [256, 512)·2^k, so values above 464·2^k clamp, where
// the default round-up rule clamps nothing.
TEST_F(CalibrateBlocks, TheConfiguredPolicysOwnOptionsAreMeasured) {
  const auto cfg = outlier_config("mxfp8", R"(  { type = "linear", name = "wide_in", out = 32 },
  { type = "relu", name = "act" },
  { type = "linear", name = "head", out = 4 },)");
  auto saturated = [&](const std::string& extra, const std::string& name) {
    const auto out = dir_ / name;
    const auto r = run(
        "calibrate " + cfg.string() + " --steps 2 " + extra + " --output " + out.string(), dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const std::string text = slurp(out);
    const std::string line = "# block wide_in gemm_input mxfp8 ";
    const auto at = text.find(line);
    EXPECT_NE(at, std::string::npos) << text;
    const auto key = text.find("per_block_saturated=", at);
    return std::stoll(text.substr(key + std::string("per_block_saturated=").size()));
  };
  EXPECT_EQ(saturated("", "round_up.toml"), 0);
  EXPECT_GT(saturated("--set 'precision.mxfp8.scale_rule=\"ocp\"'", "ocp.toml"), 0);
}

TEST_F(CalibrateBlocks, ReportOnlyUnderOtherPoliciesAndNeverWithAConvolution) {
  // bf16-mixed: no block report unless asked; with --blocks the report, but the file keeps the
  // policy.
  const std::string mlp = R"(  { type = "linear", name = "wide_in", out = 32 },
  { type = "relu", name = "act" },
  { type = "linear", name = "head", out = 4 },)";
  const auto cfg = outlier_config("bf16-mixed", mlp);
  auto r =
      run("calibrate " + cfg.string() + " --steps 1 --output " + (dir_ / "a.toml").string(), dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.out, "block scaling")) << r.out;
  EXPECT_FALSE(has(slurp(dir_ / "a.toml"), "# block ")) << slurp(dir_ / "a.toml");
  r = run(
      "calibrate " + cfg.string() + " --steps 1 --blocks --output " + (dir_ / "b.toml").string(),
      dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "block scaling, 1 sampled step")) << r.out;
  EXPECT_TRUE(has(r.out, "fp8-block would be safe")) << r.out;
  EXPECT_EQ(string_option(core::Config::from_file(dir_ / "b.toml"), "precision", "policy"),
            "bf16-mixed");

  // A convolution: the block policies refuse the model at plan time, so none is named.
  const auto conv = write_file("conv.toml", tiny_cnn(5, "fp8-current"));
  r = run("calibrate " + conv.string() + " --steps 1 --output " + (dir_ / "c.toml").string(), dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "refused")) << r.out;
  EXPECT_TRUE(has(r.out, "no block policy named")) << r.out;
  EXPECT_EQ(string_option(core::Config::from_file(dir_ / "c.toml"), "precision", "policy"),
            "fp8-current");
}

// The config's overrides are part of the plan calibration judges, and the file carries them
// before its own (merging replaces the whole array): the merged run is the one the table printed.
// fc1 pinned to fp32 stays fp32; the other ops are planned and recommended as without the pin.
// --steps past run.steps measures without the final evaluation calibration promises to skip.
TEST_F(Calibrate, TheConfigsOverridesArePlannedAndCarriedIntoTheFile) {
  const auto cfg = write_file("pinned.toml", slurp(quickstart()) +
                                                 "\n[[precision.override]]\nlayers = \"fc1\"\n"
                                                 "compute = \"fp32\"\n");
  const auto out = dir_ / "rec.toml";
  const auto cal = run("calibrate " + cfg.string() +
                       " --steps 5 --set run.steps=3 --set precision.policy=bf16-mixed --output " +
                       out.string());
  ASSERT_EQ(cal.exit_code, 0) << cal.err;
  EXPECT_FALSE(has(cal.err, "eval at step")) << cal.err;
  EXPECT_TRUE(has(cal.out, "\nfc1    fp32     fp32         planned fp32")) << cal.out;
  EXPECT_TRUE(has(cal.out, "\nfc2    bf16     bf16")) << cal.out;
  const std::string rec = slurp(out);
  EXPECT_TRUE(has(rec, "# the config's own (" + cfg.string() + ":")) << rec;
  EXPECT_TRUE(has(rec,
                  "[[precision.override]]\nlayers = \"fc1\"\nweight = \"fp32\"\n"
                  "gemm_input = \"fp32\"\nactivation = \"fp32\"\nactivation_grad = \"fp32\"\n"))
      << rec;
  EXPECT_FALSE(has(rec, "override = []")) << rec;
  const std::string check =
      "check " + cfg.string() + " --skip-rehearsal --set precision.policy=bf16-mixed";
  auto row = [](const std::string& text, const std::string& node) {
    const auto at = text.find("#   " + node + " ");
    return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at) - at);
  };
  const auto pinned = run(check);
  ASSERT_EQ(pinned.exit_code, 0) << pinned.err;
  const auto merged = run(check + " --merge " + out.string());
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  EXPECT_TRUE(has(row(merged.out, "fc1"), "fp32/fp32/fp32/fp32")) << merged.out;
  for (const char* node : {"fc1", "fc2", "head"})
    EXPECT_EQ(row(merged.out, node), row(pinned.out, node)) << merged.out;
}

// A convolution has no block-scaled GEMM: a block-scaled policy plans the CNN only with the
// override its refusal names. Calibration plans with the config's overrides, so it calibrates
// such a config, and the file it writes keeps the override: the merged config trains.
TEST_F(Calibrate, ACnnUnderABlockScaledPolicyCalibratesWithItsConvolutionsOverridden) {
  const std::string model = tiny_cnn(3, "fp8-block");
  const auto bare = write_file("bare.toml", model);
  auto r =
      run("calibrate " + bare.string() + " --steps 2 --output " + (dir_ / "a.toml").string(), dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "no block-scaled GEMM path") &&
              has(r.err, "layers = \"conv\", gemm_input = \"bf16\""))
      << r.err;
  const auto kept = write_file(
      "kept.toml", model + "[[precision.override]]\nlayers = \"conv\"\ngemm_input = \"bf16\"\n");
  const auto out = dir_ / "b.toml";
  r = run("calibrate " + kept.string() + " --steps 2 --output " + out.string(), dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "\nhead  fp8-block  fp8-block    safe in fp8-block")) << r.out;
  const std::string rec = slurp(out);
  EXPECT_TRUE(has(rec, "policy = \"fp8-block\"")) << rec;
  EXPECT_TRUE(has(rec, "[[precision.override]]\nlayers = \"conv\"\ngemm_input = \"bf16\"\n"))
      << rec;
  r = run("train " + bare.string() + " --merge " + out.string() + " --set run.steps=1", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(Calibrate, TwoRunsWriteTheSameFile) {
  const auto out = dir_ / "same.toml";
  const std::string args = "calibrate " + demo_ +
                           " --steps 3 --set precision.policy=fp16-mixed --output " + out.string();
  const auto first = run(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::string a = slurp(out);
  const auto refused = run(args);
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_TRUE(has(refused.err, "already exists")) << refused.err;
  EXPECT_EQ(slurp(out), a);
  const auto second = run(args + " --force");
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(slurp(out), a);
  EXPECT_FALSE(a.empty());
}

TEST_F(Calibrate, BadInputExitsTwoNamingTheProblem) {
  const auto out = dir_ / "never.toml";
  for (const std::string steps : {"0", "-4"}) {
    const auto r = run("calibrate " + demo_ + " --steps " + steps + " --output " + out.string());
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(has(r.err, "--steps: " + steps + " is out of range")) << r.err;
    EXPECT_TRUE(has(r.err, "HINT")) << r.err;
  }

  // --blocks is a flag: a value it cannot read is refused.
  {
    const auto r = run("calibrate " + demo_ + " --blocks=maybe --output " + out.string());
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(has(r.err, "--blocks")) << r.err;
  }

  const auto broken = write_file("broken.toml", "[run\nsteps = 3\n");
  auto r = run("calibrate " + broken.string() + " --output " + out.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "broken.toml:1:")) << r.err;

  // A backend that cannot run the model in FP32 (a layernorm without the layer-norm facet): the
  // plan stops before any step, naming the node and its config line.
  const auto no_norm = write_file("no_norm.toml", std::string(R"([plugins]
paths = [")") + MIXTRAIN_TEST_PLUGIN_DIR + R"(/cpu_without_layer_norm"]
[run]
steps = 5
[backend]
type = "test_cpu_without_layer_norm"
[precision]
policy = "bf16-mixed"
[model]
layers = [
  { type = "linear", name = "fc1", out = 16 },
  { type = "layernorm", name = "norm" },
  { type = "linear", name = "head", out = 4 },
]
[data]
source = "synthetic"
batch_size = 32
[data.synthetic]
kind = "clusters"
rows = 256
features = 8
num_classes = 4
)");
  r = run("calibrate " + no_norm.string() + " --output " + out.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "calibration runs the model in FP32")) << r.err;
  EXPECT_TRUE(has(r.err, "node 'norm'")) << r.err;
  EXPECT_TRUE(has(r.err, "no_norm.toml:12:")) << r.err;
  EXPECT_FALSE(has(r.out, "calibration:")) << "no step may run: " << r.out;

  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace mixtrain::test
