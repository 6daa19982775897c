// Swapping a component never needs an edit: every shipped config crossed with every precision
// policy and every loss scaler passes `mixtrain check` with nothing but --set, and a data source
// swaps the same way. Through the real executable.
#include <algorithm>
#include <set>

#include "cli_test_support.h"
#include "npy_test_support.h"
#include "shipped_configs.h"

namespace mixtrain::test {
namespace {

// Component names of one kind, from `mixtrain plugins` (so a new policy or scaler joins the
// cross product by itself): rows look like "  policy      fp8-delayed   (libmixtrain_fp8.so) ...".
std::vector<std::string> components_of(const std::string& listing, const std::string& kind) {
  std::vector<std::string> out;
  std::istringstream in(listing);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string first, second;
    words >> first >> second;
    if (first == kind && !second.empty()) out.push_back(second);
  }
  return out;
}

class ConfigSwaps : public CliTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(ConfigSwaps, EveryPolicyAndScalerChecksWithNoEdit) {
  const auto listing = run("plugins");
  ASSERT_EQ(listing.exit_code, 0) << listing.err;
  const auto policies = components_of(listing.out, "policy");
  std::set<std::string> block_scaled;
  {
    std::istringstream in(listing.out);
    std::string line;
    while (std::getline(in, line))
      if (line.find("libmixtrain_block_scaling") != std::string::npos) {
        std::istringstream words(line);
        std::string kind, name;
        words >> kind >> name;
        if (kind == "policy") block_scaled.insert(name);
      }
  }
  const auto scalers = components_of(listing.out, "scaler");
  // The shipped ones at least: the listing's format is what this test reads.
  for (const std::string p :
       {"fp32", "tf32", "fp16-mixed", "bf16-mixed", "auto", "fp8-delayed", "fp8-current"})
    ASSERT_NE(std::find(policies.begin(), policies.end(), p), policies.end())
        << p << " missing from:\n"
        << listing.out;
  for (const std::string s : {"none", "static", "dynamic"})
    ASSERT_NE(std::find(scalers.begin(), scalers.end(), s), scalers.end())
        << s << " missing from:\n"
        << listing.out;

  // A check's time goes to drawing initial weights and synthetic rows, not to the component
  // sections under test: the 21 swaps run on a smaller copy of the same graph — fewer synthetic
  // rows, the wide MLPs' two 4096-wide hidden layers at 512 (on 1024 rows), the ResNets at 1/8 of
  // their widths on 512 images (ResNet-50's at 64×64: 0.8 s a check against 47) — with the same
  // layers, blocks, strides and data source. The config as shipped is checked once, with its own
  // components (test_cnn.cpp checks ResNet-50's full size). None rehearses a step for its memory
  // figures (test_memory_plan.cpp holds those to the runs): --skip-rehearsal.
  const auto& name = GetParam();
  auto cfg = config(name) + " --skip-rehearsal";
  const std::string smaller = smaller_copy(name, dir_);
  // own-images.toml and gpt2-tiny-lora.toml as shipped read files that are not there (the user's
  // images, the README walk's GPT-2 folder): the copy's are their own.
  const bool reads_user_files = name == "own-images.toml" || name == "gpt2-tiny-lora.toml";
  if (reads_user_files) cfg += smaller;
  if (name != "resnet50-bf16.toml") {
    const auto shipped = run("check " + cfg);
    EXPECT_EQ(shipped.exit_code, 0) << name << " as shipped:\n" << shipped.err;
  }
  if (!reads_user_files) cfg += smaller;
  for (const auto& policy : policies)
    for (const auto& scaler : scalers) {
      const auto r = run("check " + cfg + " --set precision.policy=" + policy +
                         " --set scaler.type=" + scaler);
      // The block-scaled policies (plugin block_scaling) have a GEMM path for linear nodes only:
      // on a convolutional graph they refuse at plan time, naming the node and the override that
      // keeps it out (plugins/block_scaling/README.md). That refusal is the documented answer.
      if (block_scaled.count(policy) != 0 && r.exit_code == 2 &&
          r.err.find("(conv2d)") != std::string::npos &&
          r.err.find("no block-scaled GEMM path") != std::string::npos &&
          r.err.find("[[precision.override]]") != std::string::npos)
        continue;
      EXPECT_EQ(r.exit_code, 0) << GetParam() << " with policy " << policy << " and scaler "
                                << scaler << ":\n"
                                << r.err;
      if (r.exit_code != 0) continue;
      EXPECT_NE(r.out.find("policy = \"" + policy + "\""), std::string::npos) << r.out;
      EXPECT_NE(r.out.find("[scaler]\ntype = \"" + scaler + "\""), std::string::npos) << r.out;
    }
}

INSTANTIATE_TEST_SUITE_P(Shipped, ConfigSwaps, ::testing::ValuesIn(shipped_configs()),
                         [](const auto& info) {
                           std::string name = info.param.substr(0, info.param.size() - 5);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

class ConfigSwap : public CliTest {};

TEST_F(ConfigSwap, DataSourceSwapsToNpyFromTheCommandLineWithRelativePaths) {
  // A small npy dataset written by the sample tool, in a folder that is not the config's.
  const auto data = dir_ / "data";
  fs::create_directories(data);
  const auto tool =
      fs::path(MIXTRAIN_CONFIGS_DIR).parent_path() / "samples/data_tools/make_npy_dataset.py";
  const int made = std::system(("cd " + data.string() + " && /usr/bin/python3 " + tool.string() +
                                " --kind spiral --rows 600 --classes 3 --out spiral >/dev/null")
                                   .c_str());
  if (made != 0) GTEST_SKIP() << "/usr/bin/python3 with numpy is needed to write the .npy files";
  // samples/data_tools/README.md's command, run in the folder that holds data/: paths given with
  // --set are relative to the current folder, as every CLI resolves its arguments.
  const auto r =
      run("train " + quickstart() + " --set model.layers.4.out=3 --set data.source=npy" +
              " --set data.features=data/spiral_x.npy --set data.labels=data/spiral_y.npy" +
              " --set run.steps=20 --set backend.threads=1 --run-dir " + (dir_ / "run").string(),
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto resolved = slurp(dir_ / "run" / "config.toml");
  EXPECT_NE(resolved.find("[data.npy]\nfeatures = \"" + (data / "spiral_x.npy").string() + "\""),
            std::string::npos)
      << resolved;
  // The file's synthetic settings are kept, unused.
  EXPECT_EQ(resolved.find("[data.synthetic]"), std::string::npos) << resolved;
}

// A data file that does not exist is refused at the key and line that name it, with the path as
// resolved (relative to the config's folder), for a file given in the config and with --set.
TEST_F(ConfigSwap, AMissingDataFileIsNamedAtItsKeyAndLine) {
  const auto cfg = write_file(
      "npy.toml", slurp(quickstart()) + "\n[data.npy]\nfeatures = \"absent_x.npy\"\n"
                                          "labels = \"absent_y.npy\"\n");
  auto r = run("train " + cfg.string() + " --set data.source=npy --run-dir " +
               (dir_ / "run").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("npy.toml:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'data.npy.features': names \"" + (dir_ / "absent_x.npy").string() +
                       "\", which does not exist"),
            std::string::npos)
      << r.err;
  r = run("check " + cfg.string() + " --set data.source=npy --set data.npy.labels=nope.npy");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("absent_x.npy"), std::string::npos) << r.err;  // the first one named
}

// Labels 0..9 with one stray 57: the class count read from the labels is 58, and the message
// says where that count came from and that a stray label may be the cause.
TEST_F(ConfigSwap, AStrayLabelIsSuggestedWhenTheClassCountExceedsTheOutputs) {
  std::vector<float> x(40 * 32, 0.5f);
  std::vector<std::int64_t> y(40);
  for (int i = 0; i < 40; ++i) y[static_cast<std::size_t>(i)] = i % 10;
  y[17] = 57;
  write_npy(dir_ / "x.npy", "<f4", {40, 32}, x);
  write_npy(dir_ / "y.npy", "<i8", {40}, y);
  const auto r = run("check " + quickstart() + " --skip-rehearsal --set data.source=npy" +
                     " --set data.features=" + (dir_ / "x.npy").string() +
                     " --set data.labels=" + (dir_ / "y.npy").string() + " --set data.batch_size=8");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("the data has 58 classes (data.classes, or the largest label + 1"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("a label of the data is stray"), std::string::npos) << r.err;
}

// An override that stores a layer's activation in fp8 asks the GEMM for an fp8 output, which no
// backend writes: the refusal says so and names the key that puts fp8 where it can go.
TEST_F(ConfigSwap, AnFp8ActivationOverrideSaysFp8IsAnOperandDtype) {
  const auto merged = write_file(
      "fp8.toml", "[[precision.override]]\nlayers = \"fc1\"\nactivation = \"fp8_e4m3\"\n");
  const auto r = run("check " + quickstart() + " --skip-rehearsal --merge " + merged.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("fp8 is a GEMM operand dtype"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("set gemm_input = fp8_e4m3 instead"), std::string::npos) << r.err;
}

TEST_F(ConfigSwap, AFlatKeyOfAnotherComponentSaysWhereItBelongs) {
  // The old flat form: fp8 options beside the policy. Swapping the policy names the table.
  auto text = slurp(config("quickstart.toml"));
  text.insert(text.find("policy = \"fp32\"\n") + 16, "margin = 1\n");
  const auto old_form = write_file("old.toml", text);
  auto r = run("check " + old_form.string() + " --set precision.policy=fp8-delayed");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run("check " + old_form.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("'margin' is an option of"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("move it into [precision.fp8-"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("old.toml:"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace mixtrain::test
