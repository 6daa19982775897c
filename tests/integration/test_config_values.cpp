// Config values the parser must refuse, or take in stride, through the real executable: huge
// --set indices, sizes whose element counts overflow, non-finite and absurd option values,
// misleading inputs (a folder, an empty layer list), and a 10,000-layer model.
#include <gtest/gtest.h>

#include <string>

#include "cli_test_support.h"

namespace mixtrain::test {
namespace {

using CliConfig = CliTest;

constexpr const char* kInt64Max = "9223372036854775807";

// A bad-input exit: code 2, one "error:" line naming `key`, and no internal error text.
void expect_refused(const CliResult& r, const std::string& key) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "error: ")) << r.err;
  EXPECT_TRUE(has(r.err, key)) << r.err;
  EXPECT_FALSE(has(r.err, "stoul")) << r.err;
  EXPECT_FALSE(has(r.err, "internal error")) << r.err;
}

// Used to re-walk the layer array per layer and per key: 4,000 layers took over a minute.
TEST_F(CliConfig, TenThousandLayersCheck) {
  std::string text =
      "[run]\nsteps = 1\n[data]\nbatch_size = 4\n[data.synthetic]\nrows = 16\nfeatures = 4\n"
      "num_classes = 2\n[model]\nlayers = [\n";
  for (int i = 0; i < 9999; ++i)
    text += i % 2 == 0 ? "  { type = \"linear\", out = 4 },\n" : "  { type = \"relu\" },\n";
  text += "  { type = \"linear\", out = 2 },\n]\n";
  auto cfg = write_file("deep.toml", text);
  auto r = run("check " + cfg.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Layers are numbered per type: 5,001 linear layers and 4,999 relus, all in the plan.
  EXPECT_TRUE(has(r.out, "linear5001")) << r.out.substr(r.out.size() - 2000);
  EXPECT_TRUE(has(r.out, "relu4999")) << r.out.substr(r.out.size() - 2000);
  EXPECT_TRUE(has(r.out, "config OK"));
}

TEST_F(CliConfig, HugeSetIndexExits2NamingTheSet) {
  for (const std::string index : {"99999999999999999999", "18446744073709551616", "5"}) {
    const std::string set = "model.layers." + index + ".out=5";
    auto r = run("check " + quickstart() + " --set " + set);
    expect_refused(r, "--set " + set);
    EXPECT_TRUE(has(r.err, "index " + index + " is out of range")) << r.err;
  }
}

// Each used to overflow an element count (undefined behaviour) or narrow silently to int32.
TEST_F(CliConfig, OverflowingSizesExit2BeforeAllocating) {
  const std::string max = kInt64Max;
  for (const std::string key :
       {"model.layers.0.out", "data.batch_size", "data.eval_batch_size", "data.synthetic.features",
        "data.synthetic.num_classes", "data.classes"}) {
    auto r = run("check " + quickstart() + " --set " + key + "=" + max);
    expect_refused(r, key);
    EXPECT_TRUE(has(r.err, "value " + max + " is out of range")) << r.err;
    EXPECT_TRUE(has(r.err, "2147483647")) << r.err;
    EXPECT_FALSE(has(r.err, "allocate")) << r.err;
    EXPECT_FALSE(has(r.err, "found -1")) << r.err;
  }
  // rows has no schema bound: rows x features is checked before the data is generated.
  auto r = run("check " + quickstart() + " --set data.synthetic.rows=" + max);
  expect_refused(r, "rows");
  EXPECT_FALSE(has(r.err, "allocate")) << r.err;
}

TEST_F(CliConfig, NonFiniteAndAbsurdNumbersExit2) {
  for (const std::string set :
       {"optimizer.lr=inf", "optimizer.lr=1e308", "optimizer.lr=nan", "optimizer.lr=-inf",
        "optimizer.min_lr=inf", "optimizer.clip_grad_norm=nan", "data.eval_fraction=nan"}) {
    const std::string key = set.substr(0, set.find('='));
    auto r = run("check " + quickstart() + " --set " + set);
    expect_refused(r, key.substr(key.find('.') + 1));
    EXPECT_TRUE(has(r.err, "is out of range")) << set << ": " << r.err;
  }
  auto r = run("check " + quickstart() + " --set optimizer.type=sgd --set optimizer.lr=1e308");
  expect_refused(r, "lr");
  EXPECT_TRUE(has(r.err, "(0.0, 10.0]")) << r.err;
  // The static scale was already refused; the dynamic scaler's bounds now are too.
  for (const std::string set : {"scaler.type=static --set scaler.scale=inf",
                                "scaler.type=dynamic --set scaler.init_scale=inf",
                                "scaler.type=dynamic --set scaler.growth_factor=inf",
                                "scaler.type=dynamic --set scaler.max_scale=nan"}) {
    r = run("check " + quickstart() + " --set " + set);
    EXPECT_EQ(r.exit_code, 2) << set << ": " << r.err;
    EXPECT_TRUE(has(r.err, "error: ")) << r.err;
  }
}

// max_scale is the one option whose default is inf: it resolves, prints and reads back as inf.
TEST_F(CliConfig, DynamicScalerMaxScaleKeepsInfinity) {
  auto r = run("check " + quickstart() + " --set scaler.type=dynamic");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "max_scale = inf\n")) << r.out;
  r = run("check " + quickstart() + " --set scaler.type=dynamic --set scaler.max_scale=inf");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "max_scale = inf\n")) << r.out;
  // The resolved config a run writes parses again, inf included.
  const auto run_dir = dir_ / "run";
  r = run("train " + quickstart() + " --set scaler.type=dynamic --set run.steps=2 --run-dir " +
          run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("check " + (run_dir / "config.toml").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "max_scale = inf\n")) << r.out;
}

TEST_F(CliConfig, MisleadingInputsGetTheirOwnMessage) {
  auto r = run("check " + dir_.string());
  expect_refused(r, dir_.string());
  EXPECT_TRUE(has(r.err, "is a folder, not a config file")) << r.err;
  EXPECT_FALSE(has(r.err, "no layers")) << r.err;

  auto cfg = write_file("empty_layers.toml", "[model]\nlayers = []\n");
  r = run("check " + cfg.string());
  expect_refused(r, "model.layers");
  EXPECT_TRUE(has(r.err, "the model has no layers")) << r.err;
  EXPECT_FALSE(has(r.err, "expected a boolean")) << r.err;
}

}  // namespace
}  // namespace mixtrain::test
