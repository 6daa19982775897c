// A Trainer opened to evaluate, predict or sample (TrainOptions::trains = false, as `eval`,
// `predict` and `sample` open one): its optimizer is bound to no parameters, so it holds no state
// (AdamW's two moments per weight), its parameters hold no gradients, it evaluates the same
// weights to the same numbers as a Trainer that trains, and run() is refused. In process, on the
// quickstart. One opened without the training split (TrainOptions::splits = none) holds its
// weights and refuses what needs the data.
// One opened with a checkpoint's weights (TrainOptions::weights, as eval, predict and sample open
// one) holds what loading them after the constructor gives, bit for bit, though it never draws
// them; from a base model's file (checkpoint.init_from) the LoRA adapters the file lacks keep
// their seeded draw.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "mixtrain/core/train/trainer.h"
#include "quickstart_components.h"

namespace mixtrain {
namespace {

core::Trainer open_trainer(bool trains) {
  auto [e, c] = test::quickstart_components({"backend.threads=1"});
  core::TrainOptions opt;
  opt.write_outputs = false;
  opt.trains = trains;
  return core::Trainer(e, std::move(c), opt);
}

TEST(EvaluatingTrainer, HoldsNoOptimizerStateEvaluatesAlikeAndRefusesToRun) {
  auto training = open_trainer(true);
  auto evaluating = open_trainer(false);
  EXPECT_GT(training.optimizer_state_bytes(), 0u);
  EXPECT_EQ(evaluating.optimizer_state_bytes(), 0u);
  // A model that plans no training pass allocates no gradient.
  const auto parameters = training.model().parameters();
  EXPECT_TRUE(std::none_of(parameters.begin(), parameters.end(),
                           [](const core::ModelParameter* p) { return p->grad.empty(); }));
  for (const auto* p : evaluating.model().parameters()) EXPECT_TRUE(p->grad.empty()) << p->name;
  const auto a = training.evaluate(), b = evaluating.evaluate();
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.accuracy, b.accuracy);
  EXPECT_THROW(evaluating.run(), std::logic_error);
}

// A byte-level GPT whose text files do not exist: a Trainer that reads no split
// (TrainOptions::splits = none, as predict and sample open one) needs none of them.
const char* kTextGpt = R"(
[run]
seed = 1
[backend]
type = "cpu"
threads = 1
[precision]
policy = "fp32"
[optimizer]
type = "adamw"
[model]
preset = "gpt"
[model.gpt]
n_layer = 1
n_head = 2
n_embd = 16
[data]
source = "text"
block_size = 8
batch_size = 2
[data.text]
path = ["/nonexistent/mixtrain-train.txt"]
)";

core::Trainer open_without_data(bool trains) {
  auto [e, c] = test::config_components(kTextGpt, "text-gpt.toml");
  core::TrainOptions opt;
  opt.write_outputs = false;
  opt.trains = trains;
  opt.splits = core::DataSplits::none;
  return core::Trainer(e, std::move(c), opt);
}

TEST(EvaluatingTrainer, WithoutTheTrainingSplitItHoldsWeightsAndRefusesWhatNeedsData) {
  auto t = open_without_data(false);
  EXPECT_EQ(t.train_data().rows, 0);
  EXPECT_EQ(t.train_data().features, 8);
  EXPECT_EQ(t.train_data().classes, 256);
  const auto state = t.training_state(/*weights_only=*/false);  // no batch drawn: cursor 0
  EXPECT_NE(state.metadata.at("sampler").find("\"epoch\":0"), std::string::npos);
  EXPECT_THROW(t.evaluate(), std::logic_error);
  EXPECT_THROW(t.run(), std::logic_error);
  EXPECT_THROW(t.memory_report(/*rehearse=*/true), std::logic_error);
  EXPECT_NO_THROW(t.memory_report(/*rehearse=*/false));
  EXPECT_THROW(open_without_data(true), std::logic_error);
}

// A Trainer's weights by name: its state's "param/" tensors' bytes.
std::map<std::string, std::vector<std::byte>> weights_of(const core::Trainer& t) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& tensor : t.training_state(/*weights_only=*/true).tensors)
    if (tensor.name.rfind("param/", 0) == 0) out[tensor.name] = tensor.bytes;
  return out;
}

// kTextGpt under run.seed = `seed` with `extra` TOML appended, opened as `sample` opens it, with
// the rest of `opt`.
core::Trainer open_text_gpt(int seed, const std::string& extra, core::TrainOptions opt = {}) {
  auto [e, c] = test::config_components(kTextGpt + extra, "text-gpt.toml",
                                        {"run.seed=" + std::to_string(seed)});
  opt.write_outputs = false;
  opt.trains = false;
  opt.splits = core::DataSplits::none;
  return core::Trainer(e, std::move(c), opt);
}

// A base model's weights (seed 7) in the config's checkpoint format, in a folder of its own.
std::filesystem::path write_base_weights(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("mixtrain-evaluating-trainer-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto [e, c] = test::config_components(kTextGpt, "text-gpt.toml", {"run.seed=7"});
  const auto path = dir / (name + c.checkpoint_format->file_extension());
  const auto base = open_text_gpt(7, "");
  c.checkpoint_format->write(path, base.training_state(/*weights_only=*/true));
  return path;
}

TEST(EvaluatingTrainer, WeightsGivenToTheConstructorAreWhatLoadingThemAfterItGives) {
  const auto file = write_base_weights("weights");
  core::TrainOptions opt;
  opt.weights = file;
  const auto given = weights_of(open_text_gpt(1, "", opt));
  auto after = open_text_gpt(1, "");
  const auto drawn = weights_of(after);
  after.load_checkpoint(file, /*weights_only=*/true);
  EXPECT_EQ(given, weights_of(after));
  EXPECT_EQ(given, weights_of(open_text_gpt(7, "")));  // the file's, seed 7's
  EXPECT_NE(given, drawn);
  std::filesystem::remove_all(file.parent_path());
}

TEST(EvaluatingTrainer, AdaptersABaseFileLacksKeepTheirSeededDraw) {
  const auto file = write_base_weights("base");
  const std::string lora = "[model.lora]\nr = 2\nalpha = 4\ntargets = [\"h.*.attn.c_attn\"]\n";
  const auto from_base =
      weights_of(open_text_gpt(1, lora + "[checkpoint]\ninit_from = \"" + file.string() + "\"\n"));
  const auto drawn = weights_of(open_text_gpt(1, lora));
  const auto base = weights_of(open_text_gpt(7, ""));
  std::size_t adapters = 0;
  for (const auto& [name, bytes] : from_base) {
    if (name.find(".lora_") == std::string::npos) {
      EXPECT_EQ(bytes, base.at(name)) << name;
      continue;
    }
    ++adapters;
    EXPECT_EQ(bytes, drawn.at(name)) << name;
    if (name.find(".lora_A.") != std::string::npos) {
      EXPECT_NE(bytes, std::vector<std::byte>(bytes.size(), std::byte{0})) << name << " is drawn";
    }
  }
  EXPECT_EQ(adapters, 2u);  // one block's c_attn: A and B
  std::filesystem::remove_all(file.parent_path());
}

}  // namespace
}  // namespace mixtrain
