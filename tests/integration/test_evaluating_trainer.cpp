// A Trainer opened to evaluate, predict or sample (TrainOptions::trains = false, as `eval`,
// `predict` and `sample` open one): its optimizer is bound to no parameters, so it holds no state
// (AdamW's two moments per weight), it evaluates the same weights to the same numbers as a
// Trainer that trains, and run() is refused. In process, on the quickstart. One opened without the
// training split (TrainOptions::splits = none) holds its weights and refuses what needs the data.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

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

std::size_t optimizer_state_bytes(const core::Trainer& t) {
  std::size_t bytes = 0;
  for (const auto& tensor : t.training_state(/*weights_only=*/false).tensors)
    if (tensor.name.rfind("optimizer/", 0) == 0) bytes += tensor.bytes.size();
  return bytes;
}

TEST(EvaluatingTrainer, HoldsNoOptimizerStateEvaluatesAlikeAndRefusesToRun) {
  auto training = open_trainer(true);
  auto evaluating = open_trainer(false);
  EXPECT_GT(optimizer_state_bytes(training), 0u);
  EXPECT_EQ(optimizer_state_bytes(evaluating), 0u);
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

}  // namespace
}  // namespace mixtrain
