// Image folders through the real executable: a CNN trained on JPEG and PNG files cut by
// RandomResizedCrop, resumed bit for bit, with and without the loader thread; a file that is no
// image exits 2 naming it, before the first step or when its batch is drawn.
#include <map>

#include "cli_test_support.h"
#include "image_test_files.h"

namespace {

using namespace mixtrain::test;

class CliImageFolders : public CliTest {
 protected:
  // train/: 3 classes of 8 images each, of assorted sizes and both formats; val/: 2 per class.
  void make_folders() {
    int seed = 0;
    for (const char* split : {"train", "val"})
      for (const char* name : {"ant", "bee", "cat"}) {
        const auto folder = dir_ / split / name;
        fs::create_directories(folder);
        const int count = std::string(split) == "train" ? 8 : 2;
        for (int i = 0; i < count; ++i, ++seed) {
          const int w = 20 + (seed * 7) % 23, h = 18 + (seed * 11) % 29;
          if (i % 3 == 2)
            write_png(folder / ("i" + std::to_string(i) + ".png"), w, h, seed);
          else
            write_jpeg(folder / ("i" + std::to_string(i) + ".jpg"), w, h, seed);
        }
      }
  }

  fs::path folder_config() {
    return write_file("folder.toml", R"([run]
steps = 8
log_every = 1
eval_every = 4
[model]
nodes = [
  { type = "conv2d", name = "conv", inputs = ["input"], out = 6, kernel = 3, padding = 1, bias = false },
  { type = "batchnorm2d", name = "bn", inputs = ["conv"] },
  { type = "relu", name = "relu", inputs = ["bn"] },
  { type = "maxpool2d", name = "pool", inputs = ["relu"], kernel = 2 },
  { type = "global_avgpool", name = "gap", inputs = ["pool"] },
  { type = "linear", name = "fc", inputs = ["gap"], out = 3 },
]
[optimizer]
type = "sgd"
lr = 0.05
[checkpoint]
every = 4
keep = 5
[data]
source = "image_folder"
batch_size = 6
[data.image_folder]
train = "train"
eval = "val"
size = 16
threads = 2
[data.normalize]
from_training = true
[data.augment]
horizontal_flip = true
)");
  }
};

std::map<int, double> losses_by_step(const std::vector<json>& records) {
  std::map<int, double> out;
  for (const auto& j : records)
    if (j.contains("loss") && j.contains("step"))
      out[j["step"].get<int>()] = j["loss"].get<double>();
  return out;
}

TEST_F(CliImageFolders, TrainsOnTheFilesAndResumesBitForBit) {
  make_folders();
  const auto cfg = folder_config();
  auto r = run("train " + cfg.string() + " --run-dir full", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("24 images of 3 classes"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("6 images of 3 classes"), std::string::npos) << r.err;
  const auto full = losses_by_step(records(dir_ / "full" / "metrics.jsonl"));
  ASSERT_EQ(full.size(), 8u);
  bool evaluated = false;
  for (const auto& j : records(dir_ / "full" / "metrics.jsonl"))
    evaluated |= j.contains("eval_loss");
  EXPECT_TRUE(evaluated);

  r = run("train " + cfg.string() + " --resume " +
              (dir_ / "full" / "checkpoints" / "step-00000004.mxt").string() + " --run-dir resumed",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("other data"), std::string::npos) << r.err;
  const auto resumed = losses_by_step(records(dir_ / "resumed" / "metrics.jsonl"));
  ASSERT_EQ(resumed.size(), 4u);
  for (const auto& [step, loss] : resumed) EXPECT_EQ(loss, full.at(step)) << "step " << step;

  // The loader thread and the decoding threads change no batch.
  r = run("train " + cfg.string() +
              " --set data.prefetch=false --set data.image_folder.threads=1 --run-dir serial",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(losses_by_step(records(dir_ / "serial" / "metrics.jsonl")), full);

  // Without the flips the crops differ.
  r = run("train " + cfg.string() + " --set data.augment.horizontal_flip=false --run-dir plain",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(losses_by_step(records(dir_ / "plain" / "metrics.jsonl")), full);
}

TEST_F(CliImageFolders, AFileThatIsNoImageExits2NamingIt) {
  make_folders();
  std::ofstream(dir_ / "train" / "bee" / "notes.jpg") << "shopping list";
  const auto cfg = folder_config();
  auto r = run("train " + cfg.string() + " --run-dir checked", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("notes.jpg"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "checked" / "metrics.jsonl"));
  // Unchecked, the first batch that draws it stops the run, naming it (every batch of 6 of the 25
  // images within 8 steps: the file is drawn).
  r = run(
      "train " + cfg.string() + " --set data.image_folder.check_files=false --run-dir unchecked",
      dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("notes.jpg"), std::string::npos) << r.err;
  // The folder that does not exist is named at its config line.
  r = run("train " + cfg.string() + " --set data.image_folder.eval=nowhere --run-dir missing",
          dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("data.image_folder.eval"), std::string::npos) << r.err;
}

}  // namespace
