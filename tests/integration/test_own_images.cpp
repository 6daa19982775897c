// A user's second day, as configs/own-images.toml's header and the README walk it: their own
// uint8 images in torchvision's CIFAR-10 layout ([N, 32, 32, 3]) beside the config, `train` from
// the folder above configs/, Ctrl-C, `train --resume runs/own-images` with no config, then what
// TensorBoard, PyTorch and `predict` read. The shipped config, unedited, with a --set only for
// the first run's length (the resumed run reads it from the run's own config.toml), on small
// files of the same layout.
#include <csignal>

#include "cli_test_support.h"
#include "npy_test_support.h"
#include "spawned_process.h"

namespace mixtrain::test {
namespace {

using OwnImages = CliTest;
using namespace std::chrono_literals;

TEST_F(OwnImages, TrainCtrlCResumeThenTensorBoardExportAndPredictWorkTheFirstTime) {
  // The user's tree: configs/own-images.toml and data/{images,labels}.npy.
  fs::create_directories(dir_ / "configs");
  fs::create_directories(dir_ / "data");
  fs::copy_file(fs::path(MIXTRAIN_CONFIGS_DIR) / "own-images.toml",
                dir_ / "configs" / "own-images.toml");
  write_cifar_layout_images(dir_ / "data" / "images.npy", dir_ / "data" / "labels.npy", 320);

  // Far more steps than the test waits for: Ctrl-C lands mid-run.
  const auto run_dir = dir_ / "runs" / "own-images";
  Spawned p(
      "train configs/own-images.toml --set run.steps=1000000 --set run.log_every=1"
      " --set data.batch_size=16 --set run.eval_every=20",
      dir_ / "out.txt", dir_ / "err.txt", dir_);
  ASSERT_GT(p.pid(), 0);
  ASSERT_TRUE(eventually([&] { return !slurp(run_dir / "metrics.jsonl").empty(); }, 120s))
      << "no metrics record appeared: " << slurp(dir_ / "err.txt");
  p.signal(SIGINT);
  const auto status = p.wait(120s);
  ASSERT_TRUE(status.has_value()) << "still running after SIGINT";
  ASSERT_TRUE(WIFEXITED(*status));
  ASSERT_EQ(WEXITSTATUS(*status), 130) << slurp(dir_ / "err.txt");
  const auto stopped_at = summary(run_dir)["steps"].get<std::int64_t>();

  // The run folder alone: its config.toml is the config. Only the length is cut, to 40 steps
  // past the stop (the schedule keeps its horizon, with a warning).
  const auto end = stopped_at + 40;
  auto r = run("train --resume runs/own-images --set run.steps=" + std::to_string(end), dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "at step " + std::to_string(stopped_at))) << r.err;
  EXPECT_TRUE(has(r.err, "keeps the checkpoint's horizon")) << r.err;
  // Keys the resolved config.toml holds at their defaults are not reported unread.
  EXPECT_FALSE(has(r.err, "is not read")) << r.err;
  const json done = summary(run_dir);
  EXPECT_EQ(done["steps"].get<std::int64_t>(), end);
  EXPECT_FALSE(done["interrupted"].get<bool>());

  // What the config's sinks and keys promise: the TensorBoard event files and metrics.csv, the
  // normalisation statistics, the best checkpoint.
  int event_files = 0;
  for (const auto& f : fs::directory_iterator(run_dir))
    if (f.path().filename().string().rfind("events.out.tfevents.", 0) == 0) ++event_files;
  EXPECT_EQ(event_files, 2) << "one per session (the resumed one adds its own)";
  EXPECT_TRUE(has(slurp(run_dir / "metrics.csv"), "eval_top_k_accuracy"));
  const json norm = json::parse(slurp(run_dir / "normalization.json"), nullptr, false);
  ASSERT_TRUE(norm.is_object()) << slurp(run_dir / "normalization.json");
  ASSERT_EQ(norm["mean"].size(), 3u);
  EXPECT_TRUE(fs::exists(run_dir / "checkpoints" / "best.mxt"));

  // The weights for PyTorch, with the statistics in the metadata.
  r = run("export runs/own-images --format safetensors --out own.safetensors", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(slurp(dir_ / "own.safetensors"), "\"normalization\""));

  // predict reads the same channels-last file (its layout found from the model's [3, 32, 32]).
  r =
      run("predict configs/own-images.toml --checkpoint runs/own-images --input data/images.npy"
          " --out predictions.npy --output probabilities",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto probabilities = read_npy_floats(dir_ / "predictions.npy");
  ASSERT_EQ(probabilities.shape, (std::vector<std::int64_t>{320, 10}));
  // The colours are easy: 40 steps learn most of them.
  int right = 0;
  for (int row = 0; row < 320; ++row) {
    int best = 0;
    for (int c = 1; c < 10; ++c)
      if (probabilities.values[row * 10 + c] > probabilities.values[row * 10 + best]) best = c;
    right += best == row % 10;
  }
  EXPECT_GT(right, 160) << "of 320 rows";
}

}  // namespace
}  // namespace mixtrain::test
