// `mixtrain predict` against a PyTorch forward from the same weights: a ResNet-20, a ResNet-18
// (torchvision's ImageNet stem and BasicBlocks, narrowed) and the tiny GPT write the logits
// PyTorch's eval-mode forward computes, to 1e-5 of the largest logit. Each model trains two fp32
// steps in mixtrain first (from PyTorch's initial weights), so batch norm's running statistics
// and every weight have moved off their initial values; the weights go to PyTorch through
// `mixtrain export`. Skipped, with the reason, where /usr/bin/python3 cannot import torch.
#include <algorithm>
#include <cmath>
#include <string>

#include "cnn_torch_support.h"
#include "gpt_torch_support.h"
#include "npy_test_support.h"

namespace mixtrain::test {
namespace {

// max |ours - theirs| over max |theirs|, after checking the shapes agree.
double relative_gap(const NpyFloats& ours, const NpyFloats& theirs) {
  EXPECT_EQ(ours.shape, theirs.shape);
  if (ours.values.size() != theirs.values.size() || theirs.values.empty()) return 1.0;
  double gap = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < ours.values.size(); ++i) {
    gap = std::max(gap, std::abs(static_cast<double>(ours.values[i]) - theirs.values[i]));
    scale = std::max(scale, std::abs(static_cast<double>(theirs.values[i])));
  }
  return gap / scale;
}

std::string resnet_config(const std::string& resnet) {
  return R"(
[run]
name = "predict-parity"
seed = 5
steps = 2
[backend]
type = "cpu"
[precision]
policy = "fp32"
[scaler]
type = "none"
[optimizer]
type = "sgd"
[optimizer.sgd]
lr = 0.05
momentum = 0.9
[model]
preset = "resnet"
[model.resnet]
)" + resnet +
         R"(
[data]
source = "npy"
batch_size = 32
eval_batch_size = 48
shuffle = false
eval_fraction = 0.0
classes = 10
[data.npy]
features = "train_x.npy"
labels = "train_y.npy"
[checkpoint]
fsync = false
init_from = "init.safetensors"
)";
}

class PredictParityTorch : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    if (!torch_available()) GTEST_SKIP() << torch_missing_message("predict parity with PyTorch");
  }

  // Trains `config` two steps from PyTorch's init, predicts eval_x.npy, has PyTorch evaluate the
  // exported weights on it, and returns the logits gap.
  double resnet_gap(const std::string& config, const std::string& init_args) {
    EXPECT_TRUE(make_resnet_images(dir_, "train", 64, 1, 0.2).is_object());
    EXPECT_TRUE(make_resnet_images(dir_, "eval", 50, 2, 0.2).is_object());
    EXPECT_TRUE(
        run_resnet_reference(dir_, init_args + " --out " + (dir_ / "init.safetensors").string())
            .is_object());
    const auto cfg = write_file("resnet.toml", config).string();
    auto r = run("train " + cfg + " --run-dir run", dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    r = run("predict " + cfg + " --checkpoint run --input eval_x.npy --out ours.npy", dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    r = run("export run --format safetensors --out ours.safetensors", dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const json theirs = run_resnet_reference(
        dir_, "eval --weights " + (dir_ / "ours.safetensors").string() + " --features " +
                  (dir_ / "eval_x.npy").string() + " --labels " + (dir_ / "eval_y.npy").string() +
                  " --logits-out " + (dir_ / "theirs.npy").string());
    EXPECT_TRUE(theirs.is_object());
    return relative_gap(read_npy_floats(dir_ / "ours.npy"), read_npy_floats(dir_ / "theirs.npy"));
  }
};

TEST_F(PredictParityTorch, ResNet20LogitsAreAPyTorchEvalForward) {
  const double gap = resnet_gap(resnet_config("blocks = [3, 3, 3]\nwidths = [16, 32, 64]\n"
                                              "stem = \"cifar\"\n"),
                                "init --blocks 3,3,3 --widths 16,32,64 --classes 10 --seed 13");
  EXPECT_LT(gap, 1e-5);
}

TEST_F(PredictParityTorch, ResNet18LogitsAreAPyTorchEvalForward) {
  const double gap = resnet_gap(resnet_config("blocks = [2, 2, 2, 2]\nwidths = [8, 16, 32, 64]\n"
                                              "stem = \"imagenet\"\n"),
                                "init --blocks 2,2,2,2 --widths 8,16,32,64 --classes 10 --seed 13 "
                                "--stem imagenet");
  EXPECT_LT(gap, 1e-5);
}

const char* kGptConfig = R"(
[run]
name = "gpt-predict-parity"
seed = 5
steps = 2
[backend]
type = "cpu"
[precision]
policy = "fp32"
[scaler]
type = "none"
[optimizer]
type = "adamw"
[optimizer.adamw]
lr = 0.003
[model]
preset = "gpt"
[model.gpt]
n_layer = 2
n_head = 4
n_embd = 64
[data]
source = "tokens"
train = "train.bin"
eval = "eval.bin"
block_size = 32
vocab_size = 64
batch_size = 4
eval_batch_size = 4
shuffle = false
[checkpoint]
fsync = false
init_from = "init.safetensors"
init_layout = "gpt2"
)";

TEST_F(PredictParityTorch, TinyGptLogitsAtEveryPositionAreAPyTorchForward) {
  write_token_walk(dir_ / "train.bin", 2000, 21);
  write_token_walk(dir_ / "eval.bin", 32 * 6 + 1, 22);  // six windows, each with its targets
  ASSERT_TRUE(run_gpt_reference(dir_,
                                "init --n-layer 2 --n-head 4 --n-embd 64 --block-size 32 "
                                "--vocab-size 64 --seed 13 --layout gpt2 --out " +
                                    (dir_ / "init.safetensors").string())
                  .is_object());
  const auto cfg = write_file("gpt.toml", kGptConfig).string();
  auto r = run("train " + cfg + " --run-dir run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("predict " + cfg + " --checkpoint run --input eval.bin --positions all --out ours.npy",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json ours = json::parse(r.out);
  r = run("export run --format safetensors --layout gpt2 --out ours.safetensors", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json theirs = run_gpt_reference(
      dir_, "loss --layout gpt2 --weights " + (dir_ / "ours.safetensors").string() + " --tokens " +
                (dir_ / "eval.bin").string() + " --block-size 32 --logits-out " +
                (dir_ / "theirs.npy").string());
  ASSERT_TRUE(theirs.is_object());
  EXPECT_LT(relative_gap(read_npy_floats(dir_ / "ours.npy"), read_npy_floats(dir_ / "theirs.npy")),
            1e-5);
  // The loss predict prints is PyTorch's held-out loss of the same windows.
  EXPECT_LT(std::abs(ours["loss"].get<double>() - theirs["loss"].get<double>()) /
                theirs["loss"].get<double>(),
            1e-5);
}

}  // namespace
}  // namespace mixtrain::test
