// A Trainer opened to evaluate, predict or sample (TrainOptions::trains = false, as `eval`,
// `predict` and `sample` open one): its optimizer is bound to no parameters, so it holds no state
// (AdamW's two moments per weight), it evaluates the same weights to the same numbers as a
// Trainer that trains, and run() is refused. In process, on the quickstart.
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

}  // namespace
}  // namespace mixtrain
