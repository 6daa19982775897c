// `mixtrain predict` through the real executable: its numbers are `eval`'s on the same rows (loss,
// accuracy, and the argmax of the logits it writes), images give the same predictions in either
// layout, a language model writes its last or every position, and bad input exits 2 with the fix.
#include <algorithm>
#include <cmath>
#include <random>

#include "cli_test_support.h"
#include "npy_test_support.h"
#include "safetensors_test_support.h"

namespace mixtrain::test {
namespace {

using Predict = CliTest;

// Three Gaussian clusters in 8 dimensions, labels as int64 (what numpy writes by default).
void write_clusters(const fs::path& dir, int rows, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> x;
  std::vector<std::int64_t> y;
  for (int r = 0; r < rows; ++r) {
    const int c = r % 3;
    y.push_back(c);
    for (int f = 0; f < 8; ++f) x.push_back((f % 3 == c ? 2.0f : 0.0f) + noise(rng));
  }
  write_npy(dir / "x.npy", "<f4", {rows, 8}, x);
  write_npy(dir / "y.npy", "<i8", {rows}, y);
}

const char* kMlp = R"(
[run]
name = "mlp"
seed = 3
steps = 30
[backend]
type = "cpu"
threads = 1
[precision]
policy = "bf16-mixed"
[optimizer]
type = "adamw"
[optimizer.adamw]
lr = 0.01
[model]
layers = [ { type = "linear", out = 16 }, { type = "relu" }, { type = "linear", out = 3 } ]
[data]
source = "npy"
batch_size = 16
eval_batch_size = 20
eval_fraction = 0.0
[data.npy]
features = "x.npy"
labels = "y.npy"
[checkpoint]
fsync = false
)";

std::size_t argmax(const float* v, std::size_t n) {
  return static_cast<std::size_t>(std::max_element(v, v + n) - v);
}

TEST_F(Predict, OnTheRowsEvalReadsItGivesEvalsLossAccuracyAndArgmax) {
  write_clusters(dir_, 90, 1);
  const auto cfg = write_file("mlp.toml", kMlp).string();
  ASSERT_EQ(run("train " + cfg + " --run-dir run", dir_).exit_code, 0);
  auto r = run("eval " + cfg + " --checkpoint run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json eval = json::parse(r.out);
  // eval_fraction = 0: eval reads the training rows, and says so.
  EXPECT_NE(r.err.find("no held-out rows"), std::string::npos) << r.err;
  r = run("predict " + cfg + " --checkpoint run --input x.npy --labels y.npy --out p.npy", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json pred = json::parse(r.out);
  // The same batches under the same bf16 plan: the same bits.
  EXPECT_EQ(pred["loss"].get<double>(), eval["eval_loss"].get<double>());
  EXPECT_EQ(pred["accuracy"].get<double>(), eval["eval_accuracy"].get<double>());
  EXPECT_EQ(pred["labelled_rows"], 90);
  EXPECT_EQ(pred["loss_over"], "rows");
  EXPECT_EQ(pred["shape"], json::array({90, 3}));
  EXPECT_GT(pred["accuracy"].get<double>(), 0.8) << "the model learnt the clusters";
  const auto logits = read_npy_floats(dir_ / "p.npy");
  ASSERT_EQ(logits.shape, (std::vector<std::int64_t>{90, 3}));
  EXPECT_EQ(logits.descr, "'<f4'");
  int correct = 0;
  for (int i = 0; i < 90; ++i) correct += argmax(&logits.values[3 * i], 3) == std::size_t(i % 3);
  EXPECT_EQ(correct / 90.0, pred["accuracy"].get<double>());

  // Probabilities are the softmax of those logits; top-1 is their argmax.
  r = run("predict " + cfg + " --checkpoint run --input x.npy --out q.npy --output probabilities",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(json::parse(r.out).contains("loss")) << "no labels, no loss";
  const auto probs = read_npy_floats(dir_ / "q.npy");
  ASSERT_EQ(probs.values.size(), logits.values.size());
  for (int i = 0; i < 90; ++i) {
    const float* l = &logits.values[3 * i];
    const double top = *std::max_element(l, l + 3);
    double z = 0;
    for (int c = 0; c < 3; ++c) z += std::exp(l[c] - top);
    for (int c = 0; c < 3; ++c)
      EXPECT_NEAR(probs.values[3 * i + c], std::exp(l[c] - top) / z, 1e-6) << i << "," << c;
  }
  r = run("predict " + cfg + " --checkpoint run --input x.npy --out k.npy --top-k 1", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto best = read_npy_floats(dir_ / "k.npy");  // records of (int32 class, float32 score)
  ASSERT_EQ(best.shape, (std::vector<std::int64_t>{90, 1}));
  ASSERT_EQ(best.values.size(), 180u);
  for (int i = 0; i < 90; ++i) {
    std::int32_t cls = 0;
    std::memcpy(&cls, &best.values[2 * i], 4);
    EXPECT_EQ(static_cast<std::size_t>(cls), argmax(&logits.values[3 * i], 3)) << "row " << i;
    EXPECT_EQ(best.values[2 * i + 1],
              *std::max_element(&logits.values[3 * i], &logits.values[3 * i] + 3));
  }
  // Labels in another format than the inputs: named, both files.
  {
    std::ofstream idx(dir_ / "y.idx", std::ios::binary);
    const unsigned char head[8] = {0, 0, 0x08, 1, 0, 0, 0, 90};
    idx.write(reinterpret_cast<const char*>(head), 8);
    for (int i = 0; i < 90; ++i) idx.put(static_cast<char>(i % 3));
  }
  r = run("predict " + cfg + " --checkpoint run --input x.npy --labels y.idx --out m.npy", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--labels y.idx is an IDX file but --input x.npy is a .npy file"),
            std::string::npos)
      << r.err;
  // A file name that is not UTF-8 is written, and named in valid JSON (U+FFFD for the byte).
  r = run("predict " + cfg + " --checkpoint run --input x.npy --out 'p_\xff.npy'", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "p_\xff.npy"));
  EXPECT_NE(json::parse(r.out)["predictions"].get<std::string>().find("p_\xef\xbf\xbd.npy"),
            std::string::npos)
      << r.out;
}

const char* kCnn = R"(
[run]
name = "cnn"
seed = 2
steps = 6
[backend]
type = "cpu"
threads = 1
[precision]
policy = "fp32"
[optimizer]
type = "sgd"
[optimizer.sgd]
lr = 0.05
momentum = 0.9
[model]
nodes = [
  { type = "conv2d", name = "conv", inputs = ["input"], out = 4, kernel = 3, padding = 1 },
  { type = "batchnorm2d", name = "bn", inputs = ["conv"] },
  { type = "relu", name = "relu", inputs = ["bn"] },
  { type = "global_avgpool", name = "gap", inputs = ["relu"] },
  { type = "linear", name = "fc", inputs = ["gap"], out = 3 },
]
[data]
source = "npy"
batch_size = 8
eval_batch_size = 16
eval_fraction = 0.0
[data.npy]
features = "img.npy"
labels = "y.npy"
[data.normalize]
from_training = true
[checkpoint]
fsync = false
)";

// Channels-first images [N, 3, 6, 5] and the same pixels channels-last [N, 6, 5, 3].
void write_images(const fs::path& dir, int rows) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> nchw(static_cast<std::size_t>(rows) * 90), nhwc(nchw.size());
  std::vector<std::int64_t> y;
  for (int n = 0; n < rows; ++n) {
    y.push_back(n % 3);
    for (int c = 0; c < 3; ++c)
      for (int h = 0; h < 6; ++h)
        for (int w = 0; w < 5; ++w) {
          const float v = u(rng) + (c == n % 3 ? 0.5f : 0.0f);
          nchw[n * 90 + (c * 6 + h) * 5 + w] = v;
          nhwc[n * 90 + (h * 5 + w) * 3 + c] = v;
        }
  }
  write_npy(dir / "img.npy", "<f4", {rows, 3, 6, 5}, nchw);
  write_npy(dir / "img_nhwc.npy", "<f4", {rows, 6, 5, 3}, nhwc);
  write_npy(dir / "flat_nchw.npy", "<f4", {rows, 90}, nchw);
  write_npy(dir / "flat_nhwc.npy", "<f4", {rows, 90}, nhwc);
  write_npy(dir / "y.npy", "<i8", {rows}, y);
}

TEST_F(Predict, ImagesInEitherLayoutGiveTheSamePredictionsNormalisedAsTrained) {
  write_images(dir_, 40);
  const auto cfg = write_file("cnn.toml", kCnn).string();
  ASSERT_EQ(run("train " + cfg + " --run-dir run", dir_).exit_code, 0);
  auto r = run("eval " + cfg + " --checkpoint run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json eval = json::parse(r.out);
  r = run("predict " + cfg + " --checkpoint run --input img.npy --labels y.npy --out a.npy", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json pred = json::parse(r.out);
  // The training split's normalisation is applied as `eval` applies it, in eval mode (running
  // statistics): the same loss bit for bit.
  EXPECT_EQ(pred["loss"].get<double>(), eval["eval_loss"].get<double>());
  r = run("predict " + cfg + " --checkpoint run --input img_nhwc.npy --out b.npy", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("channels-last"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(dir_ / "a.npy"), slurp(dir_ / "b.npy"));
  // Named wrongly, the layout is refused with the right one named.
  r = run("predict " + cfg +
              " --checkpoint run --input img_nhwc.npy --out c.npy "
              "--image-layout nchw",
          dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--image-layout nhwc"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "c.npy"));
  // Flat rows: channels-first unless --image-layout nhwc names each row an [H, W, C] image.
  r = run("predict " + cfg + " --checkpoint run --input flat_nchw.npy --out d.npy", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(slurp(dir_ / "a.npy"), slurp(dir_ / "d.npy"));
  r = run("predict " + cfg + " --checkpoint run --input flat_nhwc.npy --image-layout nhwc" +
              " --out e.npy",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(slurp(dir_ / "a.npy"), slurp(dir_ / "e.npy"));
}

// An image or table model's checkpoint records its input shape, classes and normalisation
// ("data_shape", "normalization"), and its exports carry them: predict builds the model from
// that record and opens no data file, so a run folder predicts where its training files are not,
// the same bytes as with them (before: "data.npy.features ... does not exist"). A checkpoint
// without the record (written before it) takes them from the files as before; a damaged record
// exits 2 naming the entry.
TEST_F(Predict, ImageAndTableModelsPredictWithoutTheirTrainingFiles) {
  // Each model's files in a folder of its own: both write a y.npy.
  fs::create_directories(dir_ / "images");
  fs::create_directories(dir_ / "table");
  write_images(dir_ / "images", 24);
  write_clusters(dir_ / "table", 48, 5);
  // uint8 images, channels-last: the byte-image form, whose pixel table the record rebuilds.
  std::vector<std::uint8_t> bytes(24 * 90);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(i * 37 % 251);
  write_npy(dir_ / "images" / "bytes.npy", "|u1", {24, 6, 5, 3}, bytes);
  std::ofstream(dir_ / "images" / "cnn.toml") << kCnn;
  std::ofstream(dir_ / "table" / "mlp.toml") << kMlp;
  struct Model {
    std::string name, folder, config, input, sets;
    std::vector<std::string> training_files;
  };
  const std::vector<Model> models = {
      {"cnn", "images", "cnn.toml", "img.npy", "", {"img.npy", "y.npy"}},
      {"bytes",
       "images",
       "cnn.toml",
       "bytes.npy",
       " --set data.npy.features=bytes.npy --set data.npy.layout=nhwc",
       {"bytes.npy", "y.npy"}},
      {"mlp", "table", "mlp.toml", "x.npy", " --set run.steps=4", {"x.npy", "y.npy"}}};
  for (const auto& m : models) {
    SCOPED_TRACE(m.name);
    const fs::path dir = dir_ / m.folder;
    const std::string run_dir = m.name + "_run";
    auto r = run("train " + m.config + m.sets + " --run-dir " + run_dir, dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = run("export " + run_dir + " --format safetensors --out " + m.name + ".safetensors", dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto exported = dir / (m.name + ".safetensors");
    ASSERT_TRUE(read_st(exported).metadata.contains("data_shape"));
    fs::copy_file(dir / m.input, dir / "query.npy", fs::copy_options::overwrite_existing);
    const auto predict = [&](const std::string& checkpoint, const std::string& out) {
      return run("predict " + m.config + m.sets + " --checkpoint " + checkpoint +
                     " --input query.npy --force --out " + out,
                 dir);
    };
    r = predict(run_dir, "with.npy");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(has(r.err, "no data file is opened")) << r.err;  // present, but not read
    for (const auto& f : m.training_files)
      if (fs::exists(dir / f)) fs::rename(dir / f, dir / (f + ".moved"));
    for (const std::string& checkpoint : {run_dir, m.name + ".safetensors"}) {
      r = predict(checkpoint, "without.npy");
      ASSERT_EQ(r.exit_code, 0) << checkpoint << ": " << r.err;
      EXPECT_TRUE(has(r.err, "no data file is opened")) << r.err;
      EXPECT_EQ(slurp(dir / "with.npy"), slurp(dir / "without.npy")) << checkpoint;
    }
    // Without a readable record (written before it, or damaged: said), the files give the
    // shape; missing, they are named.
    auto old = read_st(exported);
    old.metadata.erase("data_shape");
    write_st(dir / "old.safetensors", old);
    auto damaged = read_st(exported);
    damaged.metadata["data_shape"] = R"({"features": 90, "sample_shape": [3, 6, 6], "classes": 3,
                                        "pixels": "float32"})";
    write_st(dir / "damaged.safetensors", damaged);
    for (const std::string checkpoint : {"old.safetensors", "damaged.safetensors"}) {
      const std::string out = m.name + "_" + checkpoint + ".npy";
      r = predict(checkpoint, out);
      EXPECT_EQ(r.exit_code, 2) << r.err;
      EXPECT_TRUE(has(r.err, "which does not exist")) << r.err;
      EXPECT_EQ(has(r.err, "the 'data_shape' entry gives 'sample_shape' whose product"),
                checkpoint == "damaged.safetensors")
          << r.err;
      EXPECT_FALSE(fs::exists(dir / out));
    }
    for (const auto& f : m.training_files)
      if (fs::exists(dir / (f + ".moved"))) fs::rename(dir / (f + ".moved"), dir / f);
    for (const std::string checkpoint : {"old.safetensors", "damaged.safetensors"}) {
      const std::string out = m.name + "_" + checkpoint + ".npy";
      r = predict(checkpoint, out);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_FALSE(has(r.err, "no data file is opened")) << r.err;
      EXPECT_EQ(slurp(dir / "with.npy"), slurp(dir / out));
    }
  }
}

// Built from a checkpoint's record, a session checks the config's [data] keys against the
// recorded data as loading the files would, at the key's line; and a config that would compute
// the normalisation the model was trained without is told the session does not.
TEST_F(Predict, ARecordedShapeMeetsTheConfigsDataKeysAsTheFilesWould) {
  write_images(dir_, 24);
  const auto cfg = write_file("cnn.toml", kCnn).string();
  ASSERT_EQ(run("train " + cfg + " --set run.steps=2 --run-dir run", dir_).exit_code, 0);
  fs::rename(dir_ / "img.npy", dir_ / "img.moved");
  const std::string predict = "predict " + cfg + " --checkpoint run --input img_nhwc.npy --out ";
  auto r = run(predict + "a.npy --set data.normalize.from_training=false" +
                   " --set 'data.normalize.mean=[0.5]' --set 'data.normalize.std=[0.2]'",
               dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "'data.normalize.mean': has 1 values, but the images [3, 6, 5]")) << r.err;
  r = run(predict + "b.npy --set data.pixels=uint8", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "'data.pixels'")) << r.err;
  EXPECT_TRUE(has(r.err, "hold float pixels")) << r.err;
  // Trained without normalisation: a from_training config is told, and the inputs stay as trained.
  fs::rename(dir_ / "img.moved", dir_ / "img.npy");
  std::string plain_text = kCnn;
  const std::string section = "[data.normalize]\nfrom_training = true\n";
  ASSERT_NE(plain_text.find(section), std::string::npos);
  plain_text.erase(plain_text.find(section), section.size());
  const auto plain = write_file("plain.toml", plain_text).string();
  ASSERT_EQ(run("train " + plain + " --set run.steps=2 --run-dir plain", dir_).exit_code, 0);
  r = run("predict " + plain + " --checkpoint plain --input img.npy --out as_trained.npy", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("predict " + cfg + " --checkpoint plain --input img.npy --out from_training.npy", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "was trained without normalisation, and this session's config")) << r.err;
  EXPECT_EQ(slurp(dir_ / "as_trained.npy"), slurp(dir_ / "from_training.npy"));
}

// A checkpoint of another model: a table model's record (8 features) given with a CNN's config is
// said as eval says it, naming the checkpoint and what it records, not as an error at the
// config's conv2d line that leaves the config to blame.
TEST_F(Predict, ACheckpointOfAnotherModelIsSaidAsEvalSaysIt) {
  write_clusters(dir_, 48, 5);
  const auto mlp = write_file("mlp.toml", kMlp).string();
  ASSERT_EQ(run("train " + mlp + " --set run.steps=2 --run-dir mlp_run", dir_).exit_code, 0);
  fs::create_directories(dir_ / "images");
  write_images(dir_ / "images", 24);
  std::string cnn = kCnn;
  const std::string section = "[data.normalize]\nfrom_training = true\n";
  ASSERT_NE(cnn.find(section), std::string::npos);
  cnn.erase(cnn.find(section), section.size());
  std::ofstream(dir_ / "images" / "cnn.toml") << cnn;
  const auto r =
      run("predict cnn.toml --checkpoint ../mlp_run --input img.npy --out p.npy", dir_ / "images");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err,
                  "step-00000002.mxt records an input of 8 features, which the config's "
                  "model cannot read (cnn.toml:"))
      << r.err;
  EXPECT_TRUE(has(r.err,
                  "HINT: the file belongs to a different model; use the config it was "
                  "trained with"))
      << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "images" / "p.npy"));
}

const char* kGpt = R"(
[run]
name = "gpt"
seed = 4
steps = 4
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
batch_size = 4
eval_batch_size = 3
[data.text]
path = ["train.txt"]
eval = ["eval.txt"]
[checkpoint]
fsync = false
)";

TEST_F(Predict, ALanguageModelWritesTheLastOrEveryPositionAndEvalsHeldOutLoss) {
  std::string text;
  for (int i = 0; text.size() < 600; ++i)
    text += "the cat sat on mat " + std::to_string(i % 7) + "\n";
  std::ofstream(dir_ / "train.txt") << text;
  std::ofstream(dir_ / "eval.txt") << text.substr(0, 8 * 10 + 1);  // 10 windows, all labelled
  std::ofstream(dir_ / "exact.txt") << text.substr(0, 8 * 3);      // 3 windows, the last not
  const auto cfg = write_file("gpt.toml", kGpt).string();
  ASSERT_EQ(run("train " + cfg + " --run-dir run", dir_).exit_code, 0);
  auto r = run("eval " + cfg + " --checkpoint run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json eval = json::parse(r.out);
  ASSERT_EQ(eval["rows"], 10);
  r = run("predict " + cfg + " --checkpoint run --input eval.txt --out last.npy", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json pred = json::parse(r.out);
  EXPECT_EQ(pred["loss"].get<double>(), eval["eval_loss"].get<double>());
  EXPECT_EQ(pred["accuracy"].get<double>(), eval["eval_accuracy"].get<double>());
  // eval's numbers cover every position of every window, not the last ones written: said so.
  EXPECT_EQ(pred["loss_over"], "all positions");
  EXPECT_EQ(pred["shape"], json::array({10, 256}));
  r = run("predict " + cfg + " --checkpoint run --input eval.txt --out all.npy --positions all",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto last = read_npy_floats(dir_ / "last.npy"), all = read_npy_floats(dir_ / "all.npy");
  ASSERT_EQ(all.shape, (std::vector<std::int64_t>{10, 8, 256}));
  for (std::size_t w = 0; w < 10; ++w)
    for (std::size_t v = 0; v < 256; ++v)
      ASSERT_EQ(all.values[(w * 8 + 7) * 256 + v], last.values[w * 256 + v]) << w << "," << v;
  // A stream that ends with a window: that window is predicted (the token after the file) but
  // has no target, so the loss is over the two before it.
  r = run("predict " + cfg + " --checkpoint run --input exact.txt --out exact.npy", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json exact = json::parse(r.out);
  EXPECT_EQ(exact["shape"], json::array({3, 256}));
  EXPECT_EQ(exact["labelled_rows"], 2);
}

// Predict and sample feed the model inputs of their own: a run folder copied without its token
// files (a text model's training text) predicts and samples as before; eval reads its held-out
// file alone, and names it when it is missing.
TEST_F(Predict, ALanguageModelPredictsAndSamplesWithoutItsTrainingText) {
  std::string text;
  for (int i = 0; text.size() < 600; ++i)
    text += "the cat sat on mat " + std::to_string(i % 7) + "\n";
  std::ofstream(dir_ / "train.txt") << text;
  std::ofstream(dir_ / "eval.txt") << text.substr(0, 8 * 10 + 1);
  std::ofstream(dir_ / "query.txt") << text.substr(0, 8 * 4 + 1);
  const auto cfg = write_file("gpt.toml", kGpt).string();
  ASSERT_EQ(run("train " + cfg + " --run-dir run", dir_).exit_code, 0);
  const std::string predict =
      "predict " + cfg + " --checkpoint run --input query.txt --force " + "--positions all --out ";
  const std::string sample =
      "sample " + cfg + " --checkpoint run --prompt 'the c' --tokens 12 --seed 3 --print-ids";
  ASSERT_EQ(run(predict + "with.npy", dir_).exit_code, 0);
  const auto with_files = run(sample, dir_);
  ASSERT_EQ(with_files.exit_code, 0) << with_files.err;
  fs::rename(dir_ / "train.txt", dir_ / "train.moved");
  fs::rename(dir_ / "eval.txt", dir_ / "eval.moved");
  auto r = run(predict + "without.npy", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(slurp(dir_ / "with.npy"), slurp(dir_ / "without.npy"));
  r = run(sample, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, with_files.out);
  r = run("export " + cfg + " --initial --out initial.safetensors", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;  // initial weights: the shape and the seed
  r = run("eval " + cfg + " --checkpoint run", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "eval.txt\", which does not exist")) << r.err;
  EXPECT_TRUE(has(r.err, "data.text.eval")) << r.err;
  // eval reads the held-out text alone: the numbers of the whole data's session.
  fs::rename(dir_ / "eval.moved", dir_ / "eval.txt");
  const auto held_out_only = run("eval " + cfg + " --checkpoint run", dir_);
  ASSERT_EQ(held_out_only.exit_code, 0) << held_out_only.err;
  fs::rename(dir_ / "train.moved", dir_ / "train.txt");
  const auto both = run("eval " + cfg + " --checkpoint run", dir_);
  ASSERT_EQ(both.exit_code, 0) << both.err;
  EXPECT_EQ(held_out_only.out, both.out);
  // Held-out text that is also training text is said, as a run says it.
  const auto shared = run("eval " + cfg + " --checkpoint run --set 'data.text.eval=[\"" +
                              (dir_ / "train.txt").string() + "\"]'",
                          dir_);
  ASSERT_EQ(shared.exit_code, 0) << shared.err;
  EXPECT_TRUE(has(shared.err, "is also a training file")) << shared.err;
}

TEST_F(Predict, BadInputExits2NamingTheFixAndNeverOverwritesWithoutForce) {
  write_clusters(dir_, 30, 2);
  const auto cfg = write_file("mlp.toml", kMlp).string();
  ASSERT_EQ(run("train " + cfg + " --set run.steps=2 --run-dir run", dir_).exit_code, 0);
  const std::string base = "predict " + cfg + " --checkpoint run ";
  // Inputs of another width.
  write_npy(dir_ / "wide.npy", "<f4", {2, 9}, std::vector<float>(18, 0.5f));
  auto r = run(base + "--input wide.npy --out p.npy", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("9 features"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("reads 8"), std::string::npos) << r.err;
  // A checkpoint of another model.
  ASSERT_EQ(run("train " + cfg +
                    " --set run.steps=1 --set 'model.layers=[{type=\"linear\", out=3}]'"
                    " --run-dir other",
                dir_)
                .exit_code,
            0);
  r = run("predict " + cfg + " --checkpoint other --input x.npy --out p.npy", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("belongs to a different model"), std::string::npos) << r.err;
  // A missing input file, named as the option that gave it.
  r = run(base + "--input nothere.npy --out p.npy", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--input nothere.npy does not exist"), std::string::npos) << r.err;
  // A loop of symbolic links, said as such by predict and by the config's data keys alike.
  fs::create_symlink("loop2.npy", dir_ / "loop1.npy");
  fs::create_symlink("loop1.npy", dir_ / "loop2.npy");
  r = run(base + "--input loop1.npy --out p.npy", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--input loop1.npy is a loop of symbolic links"), std::string::npos)
      << r.err;
  r = run("check " + cfg + " --set data.npy.features=loop1.npy", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("loop1.npy\", a loop of symbolic links"), std::string::npos) << r.err;
  // An output in a missing folder, before anything is loaded.
  r = run(base + "--input x.npy --out missing/p.npy", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("mkdir -p missing"), std::string::npos) << r.err;
  // --top-k larger than the classes.
  r = run(base + "--input x.npy --out p.npy --top-k 4", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("3 classes"), std::string::npos) << r.err;
  // --positions all belongs to language models.
  r = run(base + "--input x.npy --out p.npy --positions all", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--positions all is for language models"), std::string::npos) << r.err;
  // So is --stride: a table model's rows are not windows.
  r = run(base + "--input x.npy --out p.npy --stride 5", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--stride 5 spaces a language model's token windows"), std::string::npos)
      << r.err;
  // And --image-layout to images (it was ignored).
  r = run(base + "--input x.npy --out p.npy --image-layout nhwc", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--image-layout nhwc says how images are laid out; this model reads rows "
                       "of plain features"),
            std::string::npos)
      << r.err;
  // Another name than .npy is written as .npy, and said so.
  r = run(base + "--input x.npy --out p.csv", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--out p.csv is written as a NumPy .npy array"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(dir_ / "p.csv").rfind("\x93NUMPY", 0), 0u);
  // An existing file is kept without --force, replaced with it.
  std::ofstream(dir_ / "keep.npy") << "precious";
  r = run(base + "--input x.npy --out keep.npy", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(dir_ / "keep.npy"), "precious");
  r = run(base + "--input x.npy --out keep.npy --force", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_npy_floats(dir_ / "keep.npy").shape, (std::vector<std::int64_t>{30, 3}));
  // No temporary file is left behind by any of them.
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

}  // namespace
}  // namespace mixtrain::test
