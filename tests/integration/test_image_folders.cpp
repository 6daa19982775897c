// Image folders through the real executable: a CNN trained on JPEG and PNG files cut by
// RandomResizedCrop, resumed bit for bit, with and without the loader thread; a file that is no
// image exits 2 naming it, before the first step or when its batch is drawn, and the steps
// trained before are kept.
#include <map>
#include <regex>

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

// predict on image files cuts them as the run's held-out images were cut: over the held-out
// folder it measures what the run's last evaluation measured.
TEST_F(CliImageFolders, PredictReadsAnImageAFolderOrClassFolders) {
  make_folders();
  const auto cfg = folder_config();
  auto r = run("train " + cfg.string() + " --run-dir run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json last_eval;
  for (const auto& j : records(dir_ / "run" / "metrics.jsonl"))
    if (j.contains("eval_loss")) last_eval = j;
  ASSERT_EQ(last_eval["step"].get<int>(), 8);

  r = run("predict " + cfg.string() + " --checkpoint run --input val --out val.npy", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("labelled by class folder"), std::string::npos) << r.err;
  auto j = json::parse(r.out);
  EXPECT_EQ(j["rows"].get<int>(), 6);
  EXPECT_EQ(j["labelled_rows"].get<int>(), 6);
  EXPECT_EQ(j["accuracy"].get<double>(), last_eval["eval_accuracy"].get<double>());
  EXPECT_NEAR(j["loss"].get<double>(), last_eval["eval_loss"].get<double>(),
              1e-6 * std::abs(last_eval["eval_loss"].get<double>()));

  r = run("predict " + cfg.string() + " --checkpoint run --input val/bee --out bee.npy", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = json::parse(r.out);
  EXPECT_EQ(j["rows"].get<int>(), 2);
  EXPECT_FALSE(j.contains("labelled_rows"));
  r = run("predict " + cfg.string() + " --checkpoint run --input val/bee/i1.jpg --out one.npy",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["rows"].get<int>(), 1);
  // The rows of bee.npy are val/bee's two images in name order (i0.jpg, i1.jpg).
  const std::string bee = slurp(dir_ / "bee.npy"), one = slurp(dir_ / "one.npy");
  const std::size_t row = 3 * sizeof(float);
  ASSERT_GE(bee.size(), 2 * row);
  EXPECT_EQ(bee.substr(bee.size() - row), one.substr(one.size() - row));

  // Which row is which file, beside the predictions.
  EXPECT_EQ(json::parse(r.out)["row_files"].get<std::string>(), "one.files.txt");
  EXPECT_EQ(slurp(dir_ / "bee.files.txt"), "i0.jpg\ni1.jpg\n");
  // Other files of a plain folder are left out, counted; a format torchvision would read is not
  // dropped silently; images beside folders are neither kind of folder.
  write_file("val/bee/notes.txt", "x");
  r = run("predict " + cfg.string() + " --checkpoint run --input val/bee --out bee.npy --force",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("1 other files left out"), std::string::npos) << r.err;
  write_file("val/bee/x.webp", "RIFF");
  r = run("predict " + cfg.string() + " --checkpoint run --input val/bee --out bee.npy --force",
          dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("x.webp, an image format mixtrain does not decode"), std::string::npos)
      << r.err;
  fs::copy_file(dir_ / "val" / "ant" / "i0.jpg", dir_ / "val" / "loose.jpg");
  r = run("predict " + cfg.string() + " --checkpoint run --input val --out v.npy", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("holds both images and folders"), std::string::npos) << r.err;

  write_file("labels.npy", "");
  r = run(
      "predict " + cfg.string() + " --checkpoint run --input val --labels labels.npy --out x.npy",
      dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("leave out --labels"), std::string::npos) << r.err;
}

// The classes are numbered by their folders' names, which the run records (classes.json, and every
// checkpoint): eval and predict label held-out images by the record without the training folder,
// and a training folder whose classes changed is refused rather than renumbered.
TEST_F(CliImageFolders, ClassNamesAreRecordedAndARenumberingIsRefused) {
  make_folders();
  const auto cfg = folder_config();
  auto r = run("train " + cfg.string() + " --run-dir run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(slurp(dir_ / "run" / "classes.json"))["classes"],
            json::array({"ant", "bee", "cat"}));
  json last_eval;
  for (const auto& j : records(dir_ / "run" / "metrics.jsonl"))
    if (j.contains("eval_loss")) last_eval = j;

  fs::rename(dir_ / "train", dir_ / "elsewhere");
  r = run("eval " + cfg.string() + " --checkpoint run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["eval_accuracy"], last_eval["eval_accuracy"]) << r.out;
  r = run("predict " + cfg.string() + " --checkpoint run --input val --out p.npy", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["accuracy"], last_eval["eval_accuracy"]) << r.out;

  // Crops of another size than the model learned from are refused, whether the held-out rows
  // are a folder of their own or eval_fraction of the training images (a CNN ending in a global
  // pool would load into either and score other inputs).
  fs::rename(dir_ / "elsewhere", dir_ / "train");
  const std::string from_training =
      " --set data.image_folder.eval=\"\" --set data.eval_fraction=0.25";
  for (const std::string& held_out : {std::string(), from_training}) {
    r = run("eval " + cfg.string() + " --checkpoint run --set data.image_folder.size=24" + held_out,
            dir_);
    EXPECT_EQ(r.exit_code, 2) << held_out << r.err;
    EXPECT_NE(r.err.find("records a model of input [3, 16, 16]"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--set data.image_folder.size=16"), std::string::npos) << r.err;
  }
  r = run("eval " + cfg.string() + " --checkpoint run" + from_training, dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;

  // "ant" renamed "yak" numbers bee 0, cat 1, yak 2: every label would shift.
  fs::rename(dir_ / "train" / "ant", dir_ / "train" / "yak");
  fs::rename(dir_ / "val" / "ant", dir_ / "val" / "yak");
  r = run("train " + cfg.string() + " --resume run --set run.steps=10", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("class folders added since: 'yak'; gone: 'ant'"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("classes.json"), std::string::npos) << r.err;
  // A class folder more than the head's outputs is said as folders, not as a stray label.
  fs::create_directories(dir_ / "train" / "zebu");
  write_jpeg(dir_ / "train" / "zebu" / "z.jpg", 30, 30, 98);
  r = run("train " + cfg.string() + " --run-dir four", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("its 4 class folders"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("move the extra class folders out"), std::string::npos) << r.err;
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
  // A resize below the crop is said; a table kept for a swap is said once, not key by key.
  fs::remove(dir_ / "train" / "bee" / "notes.jpg");
  r = run("check " + cfg.string() + " --skip-rehearsal --set data.image_folder.resize=12", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("data.image_folder.resize = 12 is below size = 16"), std::string::npos)
      << r.err;
  r = run(
      "check " + config("resnet50-bf16.toml") +
          " --skip-rehearsal --set data.source=image_folder --set data.image_folder.train=" +
          (dir_ / "train").string() +
          " --set data.image_folder.size=32 --set data.batch_size=4 --set data.eval_batch_size=4"
          " --set model.resnet.classes=3",
      dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("[data.synthetic] (8 keys: "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("data.synthetic.rows ("), std::string::npos) << r.err;
  write_file("train/bee/notes.jpg", "shopping list");
  // The folder that does not exist is named at its config line.
  r = run("train " + cfg.string() + " --set data.image_folder.eval=nowhere --run-dir missing",
          dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("data.image_folder.eval"), std::string::npos) << r.err;
}

// A JPEG whose data end halfway through its image data (a download cut short) has a whole
// header, so check_files passes it, and fails only when its batch is drawn: the training
// batch of the step after the last settled one (the loader thread draws it during that step),
// or an evaluation's. Either way the run saves the last step's state before it exits 2, and once
// the file is replaced, --resume goes on to the uninterrupted run's losses bit for bit
// (train/settled_state.h).
TEST_F(CliImageFolders, AnErrorBetweenStepsSavesTheLastStep) {
  make_folders();
  const auto cfg = folder_config();
  // Fixed statistics (from_training would decode every training image at the start) and no
  // periodic checkpoint: what is saved is the error's.
  const std::string settings =
      " --set data.normalize.from_training=false --set data.normalize.mean=[0.5,0.5,0.5]"
      " --set data.normalize.std=[0.25,0.25,0.25] --set checkpoint.every=0";
  auto r = run("train " + cfg.string() + settings + " --run-dir full", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto full = losses_by_step(records(dir_ / "full" / "metrics.jsonl"));
  ASSERT_EQ(full.size(), 8u);

  // The step whose checkpoint the warning names (the path as the run folder was given, here
  // relative to dir_), or -1.
  const auto saved_step = [&](const std::string& log) {
    std::smatch m;
    if (!std::regex_search(log, m,
                           std::regex("after step (\\d+), whose state is saved in (.+?): once")))
      return -1;
    EXPECT_TRUE(fs::exists(dir_ / m[2].str())) << m[2].str();
    return std::stoi(m[1].str());
  };
  struct Case {
    const char* file;  // relative to dir_
    const char* run;
    int earliest, latest;  // where the step it saves may be
  };
  // bee/i1.jpg is drawn in the first epoch after the first batch (the sampler's order depends on
  // the seed alone); the held-out one, by the evaluation at step 4.
  for (const Case c :
       {Case{"train/bee/i1.jpg", "broken", 1, 7}, Case{"val/cat/i0.jpg", "evalbroken", 4, 4}}) {
    const std::string good = slurp(dir_ / c.file);
    // Cut halfway through the image data: the header check (check_files) reads up to the scan,
    // which is whole.
    const auto scan = good.find("\xff\xda");
    ASSERT_NE(scan, std::string::npos);
    write_file(c.file, good.substr(0, scan + (good.size() - scan) / 2));
    r = run("train " + cfg.string() + settings + " --run-dir " + c.run, dir_);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(std::string(c.file).substr(std::string(c.file).find('/') + 1)),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("is truncated"), std::string::npos) << r.err;
    const int step = saved_step(r.err);
    EXPECT_GE(step, c.earliest) << r.err;
    EXPECT_LE(step, c.latest) << r.err;
    EXPECT_NE(r.err.find("continue with --resume "), std::string::npos) << r.err;

    write_file(c.file, good);
    r = run("train " + cfg.string() + settings + " --resume " + (dir_ / c.run).string(), dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(losses_by_step(records(dir_ / c.run / "metrics.jsonl")), full) << c.run;
  }
}

}  // namespace
