// Image data through the real executable: CIFAR-10 files, [data.normalize], [data.augment] and the
// synthetic image source (bad inputs exit 2 naming the file and offset or the config line; an
// augmented run resumes bit for bit).
#include <map>

#include "cli_test_support.h"
#include "npy_test_support.h"
#include "safetensors_test_support.h"

namespace {

using namespace mixtrain::test;
class CliImages : public CliTest {
 protected:
  // The run in dir_/run exported to dir_/w.safetensors, and the export without its data_shape
  // record (as checkpoints written before the record were) to dir_/old.safetensors.
  void export_with_and_without_record() {
    const auto r = run("export " + (dir_ / "run").string() + " --format safetensors --out " +
                       (dir_ / "w.safetensors").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto unrecorded = read_st(dir_ / "w.safetensors");
    ASSERT_EQ(unrecorded.metadata.erase("data_shape"), 1u);
    write_st(dir_ / "old.safetensors", unrecorded);
  }
};

std::string cifar_records(int n) {
  std::string out;
  for (int r = 0; r < n; ++r) {
    out.push_back(static_cast<char>(r % 10));
    for (int i = 0; i < 3072; ++i) out.push_back(static_cast<char>((r + 7 * i) % 256));
  }
  return out;
}

TEST_F(CliImages, TruncatedCifarFileExits2NamingTheFileAndTheOffset) {
  std::ofstream(dir_ / "data_batch_1.bin", std::ios::binary)
      << cifar_records(40).substr(0, 3073 * 30 + 500);
  std::ofstream(dir_ / "test_batch.bin", std::ios::binary) << cifar_records(10);
  auto r = run("train " + quickstart() + " --set run.steps=1 --set data.source=cifar10" +
               " --set data.cifar10.path=" + dir_.string() + " --set data.batch_size=8" +
               " --run-dir " + (dir_ / "run").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("data_batch_1.bin"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("byte offset 92190"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
  // One training batch of the five trains, saying what it read.
  std::ofstream(dir_ / "data_batch_1.bin", std::ios::binary) << cifar_records(30);
  r = run("train " + quickstart() + " --set run.steps=1 --set data.source=cifar10" +
          " --set data.cifar10.path=" + dir_.string() + " --set data.batch_size=8" +
          " --run-dir " + (dir_ / "run1").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("holds 1 of the 5 training batches (data_batch_1.bin): training on 30 "
                       "records, not 50000"),
            std::string::npos)
      << r.err;
  // A folder without the test batch names what was looked for.
  fs::remove(dir_ / "test_batch.bin");
  r = run("train " + quickstart() + " --set run.steps=1 --set data.source=cifar10" +
          " --set data.cifar10.path=" + dir_.string() + " --run-dir " + (dir_ / "run2").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("test_batch.bin"), std::string::npos) << r.err;
}

// torchvision's CIFAR-10 `.data` layout, [N, 32, 32, 3] uint8: refused as channels-first with
// the shape and the key named (not a pooling error far from the cause), and with
// data.npy.layout = "nhwc" the very run the same pixels give channels-first.
TEST_F(CliImages, ChannelsLastNpyImagesTrainAsTheirChannelsFirstTwin) {
  const int n = 64;
  std::vector<std::uint8_t> nhwc(n * 32 * 32 * 3), nchw(nhwc.size());
  std::vector<std::int64_t> labels;
  for (int i = 0; i < n; ++i) {
    labels.push_back(i % 4);
    for (int h = 0; h < 32; ++h)
      for (int w = 0; w < 32; ++w)
        for (int c = 0; c < 3; ++c) {
          const auto v = static_cast<std::uint8_t>(
              (i * 31 + h * 7 + w * 3 + c * 50 + (c == i % 3 ? 90 : 0)) % 256);
          nhwc[((i * 32 + h) * 32 + w) * 3 + c] = v;
          nchw[((i * 3 + c) * 32 + h) * 32 + w] = v;
        }
  }
  write_npy(dir_ / "nhwc.npy", "|u1", {n, 32, 32, 3}, nhwc);
  write_npy(dir_ / "nchw.npy", "|u1", {n, 3, 32, 32}, nchw);
  write_npy(dir_ / "y.npy", "<i8", {n}, labels);
  const auto cfg = write_file("cnn.toml", R"([run]
steps = 3
log_every = 1
[model]
nodes = [
  { type = "conv2d", name = "conv", inputs = ["input"], out = 4, kernel = 3, padding = 1 },
  { type = "relu", name = "relu", inputs = ["conv"] },
  { type = "maxpool2d", name = "pool", inputs = ["relu"], kernel = 2 },
  { type = "global_avgpool", name = "gap", inputs = ["pool"] },
  { type = "linear", name = "fc", inputs = ["gap"], out = 4 },
]
[data]
source = "npy"
batch_size = 16
[data.npy]
features = "nhwc.npy"
labels = "y.npy"
)");
  auto r = run("train " + cfg.string() + " --run-dir bad", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("[N, 32, 32, 3]"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("data.npy.layout = \"nhwc\""), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cnn.toml:"), std::string::npos) << r.err;
  r = run("train " + cfg.string() + " --set data.npy.layout=nhwc --run-dir last", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("train " + cfg.string() + " --set data.npy.features=nchw.npy --run-dir first", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<double> last, first;
  for (const auto& rec : records(dir_ / "last" / "metrics.jsonl"))
    if (rec.contains("loss")) last.push_back(rec["loss"].get<double>());
  for (const auto& rec : records(dir_ / "first" / "metrics.jsonl"))
    if (rec.contains("loss")) first.push_back(rec["loss"].get<double>());
  ASSERT_EQ(last.size(), 3u);
  EXPECT_EQ(last, first);
  // A channels-first file read channels-last is refused the other way round.
  r = run("train " + cfg.string() +
              " --set data.npy.features=nchw.npy --set data.npy.layout=nhwc"
              " --run-dir wrong",
          dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("\"nchw\""), std::string::npos) << r.err;
}

TEST_F(CliImages, CifarFilesTrain) {
  std::ofstream(dir_ / "a.bin", std::ios::binary) << cifar_records(64);
  std::ofstream(dir_ / "b.bin", std::ios::binary) << cifar_records(16);
  auto r = run("train " + quickstart() + " --set run.steps=3 --set data.source=cifar10" +
               " --set 'data.cifar10.train=[\"" + (dir_ / "a.bin").string() + "\"]'" +
               " --set data.cifar10.eval=" + (dir_ / "b.bin").string() +
               " --set data.batch_size=16 --set data.normalize.from_training=true" +
               " --set data.augment.crop_padding=4 --set data.augment.horizontal_flip=true" +
               " --run-dir " + (dir_ / "run").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(summary(dir_ / "run").contains("eval_loss"));
  EXPECT_NE((r.out + r.err).find("normalised per channel with mean ["), std::string::npos) << r.err;
  // Statistics computed from the training split are kept by the run and travel with an export,
  // so the images can be preprocessed outside mixtrain (torchvision's Normalize(mean, std)).
  const json kept = json::parse(slurp(dir_ / "run" / "normalization.json"));
  ASSERT_EQ(kept["mean"].size(), 3u);
  ASSERT_EQ(kept["std"].size(), 3u);
  EXPECT_TRUE(kept["from_training"].get<bool>());
  EXPECT_GT(kept["std"][0].get<double>(), 0.0);
  r = run("export " + (dir_ / "run").string() + " --format safetensors --out " +
          (dir_ / "w.safetensors").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto exported = read_st(dir_ / "w.safetensors");
  ASSERT_TRUE(exported.metadata.contains("normalization")) << exported.metadata.dump();
  const json travelled = json::parse(exported.metadata["normalization"].get<std::string>());
  EXPECT_EQ(travelled["mean"], kept["mean"]);
  EXPECT_EQ(travelled["std"], kept["std"]);
  // Resumed with the normalisation it was trained on: nothing said. Without it: a warning naming
  // both, since the model would see inputs unlike those it learned from.
  const std::string warning = "was trained on inputs with mean [";
  r = run("train --resume " + (dir_ / "run").string() + " --set run.steps=4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ((r.out + r.err).find(warning), std::string::npos) << r.err;
  r = run("train --resume " + (dir_ / "run").string() +
          " --set run.steps=5 --set data.normalize.from_training=false" +
          " --set 'data.normalize.mean=[0.5,0.5,0.5]' --set 'data.normalize.std=[0.25,0.25,0.25]'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find(warning), std::string::npos) << r.err;
  EXPECT_NE((r.out + r.err).find("and this run gives it mean [0.5"), std::string::npos) << r.err;
}

// eval and predict run the weights on inputs normalised as the checkpoint records they were
// trained: a from_training config whose training file has changed since (brighter images added)
// would compute other statistics; both give what they give with the training file the run had
// (before: predictions off by up to 0.9 per pixel). A checkpoint that records its data's shape
// never opens the training file; one without the record (written before it) loads it, and the
// session says it normalises as the model was trained.
TEST_F(CliImages, EvalAndPredictNormaliseAsTheCheckpointWasTrained) {
  std::ofstream(dir_ / "a.bin", std::ios::binary) << cifar_records(64);
  std::ofstream(dir_ / "b.bin", std::ios::binary) << cifar_records(16);
  std::string grown = cifar_records(64);
  for (int r = 0; r < 64; ++r) {  // brighter copies: every pixel in [128, 255]
    std::string record = cifar_records(1);
    for (std::size_t i = 1; i < record.size(); ++i) record[i] = static_cast<char>(record[i] | 0x80);
    grown += record;
  }
  std::ofstream(dir_ / "grown.bin", std::ios::binary) << grown;
  const std::string data =
      " --set data.source=cifar10 --set data.cifar10.eval=" + (dir_ / "b.bin").string() +
      " --set data.normalize.from_training=true --set data.batch_size=16";
  const auto train_file = [&](const char* f) {
    return " --set 'data.cifar10.train=[\"" + (dir_ / f).string() + "\"]'";
  };
  auto r = run("train " + quickstart() + data + train_file("a.bin") +
               " --set run.steps=3 --run-dir " + (dir_ / "run").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_NO_FATAL_FAILURE(export_with_and_without_record());
  std::map<std::string, std::string> evaluated;
  std::map<std::string, NpyFloats> predicted;
  for (const char* f : {"a.bin", "grown.bin"}) {
    const std::string config = quickstart() + data + train_file(f);
    r = run("eval " + config + " --checkpoint " + (dir_ / "run").string());
    ASSERT_EQ(r.exit_code, 0) << f << ": " << r.err;
    EXPECT_NE(r.err.find("only the held-out files are opened"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("this session normalises as"), std::string::npos) << f << ": " << r.err;
    evaluated[f] = r.out;  // the JSON line of loss, accuracy and rows
    r = run("eval " + config + " --checkpoint " + (dir_ / "old.safetensors").string());
    ASSERT_EQ(r.exit_code, 0) << f << ": " << r.err;
    EXPECT_EQ(r.err.find("only the held-out files are opened"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("this session normalises as the model was trained") != std::string::npos,
              std::string(f) == "grown.bin")
        << f << ": " << r.err;
    EXPECT_EQ(r.out, evaluated[f]) << f;
    const auto out = dir_ / (std::string(f) + ".npy");
    r = run("predict " + config + " --checkpoint " + (dir_ / "run").string() + " --input " +
            (dir_ / "b.bin").string() + " --out " + out.string());
    ASSERT_EQ(r.exit_code, 0) << f << ": " << r.err;
    predicted[f] = read_npy_floats(out);
  }
  EXPECT_EQ(evaluated["grown.bin"], evaluated["a.bin"]);
  ASSERT_FALSE(predicted["a.bin"].values.empty());
  EXPECT_EQ(predicted["grown.bin"].values, predicted["a.bin"].values);
}

// A CIFAR-10 run evaluates on a machine that has only its held-out file: the checkpoint records
// the model's input and the normalisation computed from the training batches, so eval opens only
// test_batch.bin (or data.cifar10.eval's files) and gives the numbers it gives with every file
// there, in either pixel form. A checkpoint without the record needs the training batches and
// names them; a record of another input size, or a missing held-out file, exits 2 saying which.
TEST_F(CliImages, ACifarRunEvaluatesWithOnlyItsHeldOutFile) {
  const fs::path data = dir_ / "cifar";
  fs::create_directories(data);
  std::ofstream(data / "data_batch_1.bin", std::ios::binary) << cifar_records(48);
  std::ofstream(data / "test_batch.bin", std::ios::binary) << cifar_records(24);
  std::string config = quickstart() +
                       " --set data.source=cifar10 --set data.cifar10.path=" + data.string() +
                       " --set data.normalize.from_training=true --set data.batch_size=16";
  auto r = run("train " + config + " --set run.steps=3 --run-dir " + (dir_ / "run").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_NO_FATAL_FAILURE(export_with_and_without_record());
  const auto eval = [&](const std::string& checkpoint, const std::string& sets = "") {
    return run("eval " + config + sets + " --checkpoint " + (dir_ / checkpoint).string());
  };
  r = eval("old.safetensors");  // every file loads: the reference numbers
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string reference = r.out;
  ASSERT_NE(reference.find("\"rows\":24"), std::string::npos) << reference;
  fs::rename(data / "data_batch_1.bin", dir_ / "data_batch_1.bin.moved");
  const std::string listed =
      " --set 'data.cifar10.eval=[\"" + (data / "test_batch.bin").string() + "\"]'";
  for (const std::string checkpoint : {"run", "w.safetensors"})
    for (const std::string& sets :
         {std::string(), std::string(" --set data.pixels=float32"), listed}) {
      SCOPED_TRACE(checkpoint + sets);
      r = eval(checkpoint, sets);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_NE(r.err.find("only the held-out files are opened"), std::string::npos) << r.err;
      EXPECT_EQ(r.out, reference);
    }
  // The held-out list needs no folder.
  r = eval("run", listed + " --set data.cifar10.path=" + (dir_ / "nowhere").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, reference);
  r = eval("old.safetensors");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("data_batch_1.bin"), std::string::npos) << r.err;
  // A record of another input: said before any weight is read.
  auto other = read_st(dir_ / "w.safetensors");
  other.metadata["data_shape"] =
      R"({"features": 768, "sample_shape": [3, 16, 16], "classes": 10, "pixels": "uint8"})";
  write_st(dir_ / "other.safetensors", other);
  r = eval("other.safetensors");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("records a model of input [3, 16, 16], but the held-out CIFAR-10 images "
                       "are [3, 32, 32]"),
            std::string::npos)
      << r.err;
  // A record whose two entries disagree (one channel, three means) is not trusted: the files
  // give the shape, and the training batch is missing.
  other.metadata["data_shape"] =
      R"({"features": 1024, "sample_shape": [1, 32, 32], "classes": 10, "pixels": "uint8"})";
  write_st(dir_ / "other.safetensors", other);
  r = eval("other.safetensors");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("the 'normalization' entry has 3 channels"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("data_batch_1.bin"), std::string::npos) << r.err;
  fs::rename(data / "test_batch.bin", dir_ / "test_batch.bin.moved");
  r = eval("run");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("no test_batch.bin"), std::string::npos) << r.err;
  r = eval("run", listed);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("data.cifar10.eval"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("which does not exist"), std::string::npos) << r.err;
}

// data.pixels: CIFAR-10's bytes, kept as bytes (the default), travel to the backend as bytes and
// are decoded there through a table with the normalisation folded in; decoded when loaded
// (float32), or decoded on the host by a backend without the image_input facet, every step and
// every evaluation sees the same values, so the losses agree bit for bit.
TEST_F(CliImages, BytePixelsTrainAsTheirFloats) {
  std::ofstream(dir_ / "a.bin", std::ios::binary) << cifar_records(64);
  std::ofstream(dir_ / "b.bin", std::ios::binary) << cifar_records(16);
  const std::string common =
      "train " + quickstart() + " --set run.steps=6 --set run.log_every=1 --set run.eval_every=3" +
      " --set data.source=cifar10 --set 'data.cifar10.train=[\"" + (dir_ / "a.bin").string() +
      "\"]' --set data.cifar10.eval=" + (dir_ / "b.bin").string() +
      " --set data.batch_size=16 --set data.normalize.from_training=true" +
      " --set data.augment.crop_padding=4 --set data.augment.horizontal_flip=true" +
      " --set 'plugins.paths=[\"" + MIXTRAIN_TEST_PLUGIN_DIR + "/cpu_without_layer_norm\"]'";
  const std::string on_device = "travel to the device as bytes", on_host = "decoded on the host";
  std::map<std::string, std::map<std::string, double>> losses;
  for (const std::string way : {"bytes", "float32", "host"}) {
    const std::string set = way == "float32" ? " --set data.pixels=float32 --set backend.threads=1"
                            : way == "host"  ? " --set backend.type=test_cpu_without_image_input"
                                             : " --set backend.threads=1";
    auto r = run(common + set + " --run-dir " + (dir_ / way).string());
    ASSERT_EQ(r.exit_code, 0) << way << ": " << r.err;
    const std::string said = r.out + r.err;
    EXPECT_EQ(said.find(on_device) != std::string::npos, way == "bytes") << way << ": " << said;
    EXPECT_EQ(said.find(on_host) != std::string::npos, way == "host") << way << ": " << said;
    for (const auto& j : records(dir_ / way / "metrics.jsonl"))
      for (const char* key : {"loss", "eval_loss"})
        if (j.contains(key))
          losses[way][std::string(key) + "@" + std::to_string(j["step"].get<int>())] =
              j[key].get<double>();
  }
  ASSERT_EQ(losses["bytes"].size(), 8u);  // 6 training losses, 2 evaluations
  EXPECT_EQ(losses["float32"], losses["bytes"]);
  EXPECT_EQ(losses["host"], losses["bytes"]);
}

// data.pixels = "uint8" where there are no byte images to keep exits 2 at the key's line: plain
// synthetic features (known from the config), a float32 .npy of images (known when read).
TEST_F(CliImages, BytePixelsWithoutByteImagesPointAtTheConfig) {
  const auto cfg = write_file("clusters.toml", slurp(quickstart()) + "\n");
  auto r = run("train " + cfg.string() + " --set data.pixels=uint8 --run-dir " +
               (dir_ / "clusters").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("data.pixels"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("plain features"), std::string::npos) << r.err;
  r = run("train " + cfg.string() + " --set data.pixels=int8 --run-dir " +
          (dir_ / "int8").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("auto, uint8, float32"), std::string::npos) << r.err;

  std::vector<float> images(8 * 3 * 4 * 4, 0.5f);
  std::vector<std::int64_t> labels(8, 1);
  write_npy(dir_ / "x.npy", "<f4", {8, 3, 4, 4}, images);
  write_npy(dir_ / "y.npy", "<i8", {8}, labels);
  const auto npy = write_file("npy.toml",
                              "[run]\nsteps = 1\n[model]\nlayers = [ { type = "
                              "\"linear\", out = 2 } ]\n[data]\nsource = \"npy\"\n"
                              "batch_size = 4\npixels = \"uint8\"\n[data.npy]\n"
                              "features = \"x.npy\"\nlabels = \"y.npy\"\n");
  r = run("train " + npy.string() + " --run-dir " + (dir_ / "npy").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("npy.toml:8:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hold float pixels"), std::string::npos) << r.err;
}

const char* const kImages =
    "[model]\n"
    "layers = [ { type = \"linear\", out = 32 }, { type = \"relu\" }, { type = \"linear\", out = 4 "
    "} ]\n"
    "[data]\n"
    "source = \"synthetic\"\n"
    "batch_size = 32\n"
    "[data.synthetic]\n"
    "kind = \"images\"\n"
    "rows = 512\n"
    "num_classes = 4\n"
    "height = 8\n"
    "width = 8\n"
    "max_shift = 1\n"
    "noise = 0.4\n";

TEST_F(CliImages, NormalizeErrorsPointAtTheConfigLine) {
  auto cfg = write_file("images.toml", std::string(kImages) +
                                           "[data.normalize]\n"
                                           "mean = [0.5, 0.5, 0.5]\n"
                                           "std = [0.25, 0.25, 0.25]\n");
  auto r = run("train " + cfg.string() + " --set run.steps=1 --run-dir " + (dir_ / "run").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("images.toml:15:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1 channels"), std::string::npos) << r.err;
  cfg = write_file("images.toml", std::string(kImages) +
                                      "[data.normalize]\n"
                                      "mean = [0.5]\n"
                                      "std = [0.0]\n");
  r = run("check " + cfg.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("images.toml:16:"), std::string::npos) << r.err;
  cfg = write_file("images.toml", std::string(kImages) + "[data.augment]\ncrop_pading = 2\n");
  r = run("check " + cfg.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("crop_padding"), std::string::npos) << r.err;
  // Finite in double, but not in the float32 the pixels are normalised in.
  cfg = write_file("images.toml", std::string(kImages) +
                                      "[data.normalize]\n"
                                      "mean = [1e39]\n"
                                      "std = [0.25]\n");
  r = run("check " + cfg.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("images.toml:15:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("a float32 cannot hold"), std::string::npos) << r.err;
  // Image settings on plain features.
  r = run("check " + quickstart() + " --set data.augment.horizontal_flip=true");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("needs image data"), std::string::npos) << r.err;
}

// A crop padding of half the image's side or more leaves most crops mostly black: said once, at
// startup, naming the key and the image size; below it, nothing is said.
TEST_F(CliImages, ACropPaddingOfHalfTheImageSideIsWarnedOf) {
  const auto cfg =
      write_file("images.toml", std::string(kImages) + "[data.augment]\ncrop_padding = 4\n");
  auto r = run("check " + cfg.string() + " --skip-rehearsal");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // The key's line, not its table's (line 14, [data.augment]).
  const std::string warning = "data.augment.crop_padding = 4 (";
  EXPECT_NE(r.err.find(warning), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("images.toml:15:1) on 8x8 images: a crop keeps as little as 4x4"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find(warning), r.err.rfind(warning)) << "said twice: " << r.err;
  // Given by --set, the warning names the --set.
  r = run("check " + cfg.string() + " --skip-rehearsal --set data.augment.crop_padding=5");
  EXPECT_NE(r.err.find("data.augment.crop_padding = 5 (--set data.augment.crop_padding=5) on"),
            std::string::npos)
      << r.err;
  r = run("check " + cfg.string() + " --skip-rehearsal --set data.augment.crop_padding=3");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("crop_padding"), std::string::npos) << r.err;
}

// The augmented batch of a step is a function of (seed, batch number, rows) only, so a run resumed
// from a checkpoint sees the batches of the uninterrupted run and its losses are bit-identical.
TEST_F(CliImages, AnAugmentedRunResumesBitForBit) {
  auto cfg = write_file("images.toml", std::string(kImages) +
                                           "[data.normalize]\nfrom_training = true\n"
                                           "[data.augment]\ncrop_padding = 2\n"
                                           "horizontal_flip = true\n");
  const std::string common =
      " --set run.steps=24 --set run.log_every=1 --set run.eval_every=0"
      " --set checkpoint.every=10 --set checkpoint.keep=5";
  auto full = dir_ / "full";
  auto r = run("train " + cfg.string() + common + " --run-dir " + full.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto resumed = dir_ / "resumed";
  r = run("train " + cfg.string() + common + " --resume " +
          (full / "checkpoints" / "step-00000010.mxt").string() + " --run-dir " + resumed.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto plain = dir_ / "plain";
  r = run("train " + cfg.string() + common + " --set data.augment.crop_padding=0" +
          " --set data.augment.horizontal_flip=false --run-dir " + plain.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<int, double> full_loss, plain_loss;
  for (const auto& j : records(full / "metrics.jsonl"))
    if (j.contains("loss")) full_loss[j["step"].get<int>()] = j["loss"].get<double>();
  for (const auto& j : records(plain / "metrics.jsonl"))
    if (j.contains("loss")) plain_loss[j["step"].get<int>()] = j["loss"].get<double>();
  int compared = 0;
  for (const auto& j : records(resumed / "metrics.jsonl")) {
    if (!j.contains("loss")) continue;
    const int step = j["step"].get<int>();
    ASSERT_TRUE(full_loss.count(step)) << step;
    EXPECT_EQ(j["loss"].get<double>(), full_loss[step]) << "step " << step;
    ++compared;
  }
  EXPECT_EQ(compared, 14);
  // Augmentation really changed the batches.
  EXPECT_NE(full_loss[1], plain_loss[1]);
  EXPECT_NE(full_loss[2], plain_loss[2]);
}

// data.prefetch (on by default) prepares the next batch on a loader thread; it guesses the
// sampler's next batch, so across epoch ends, micro-batches and augmentation the steps must see
// exactly the batches of a run without it.
TEST_F(CliImages, TheLoaderThreadChangesNoBatch) {
  auto cfg = write_file("images.toml", std::string(kImages) +
                                           "[data.augment]\ncrop_padding = 2\n"
                                           "horizontal_flip = true\n");
  const std::string common =
      " --set run.steps=20 --set run.accumulate=2 --set run.log_every=1 --set run.eval_every=0"
      " --set checkpoint.every=0";
  std::map<int, double> loss[2];
  for (int prefetch = 0; prefetch < 2; ++prefetch) {
    const auto folder = dir_ / (prefetch ? "loader" : "inline");
    auto r = run("train " + cfg.string() + common + " --set data.prefetch=" +
                 (prefetch ? "true" : "false") + " --run-dir " + folder.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // 40 micro-batches: every one after the first came from the loader, none was guessed wrong.
    const bool said =
        (r.out + r.err)
            .find(
                "data.prefetch: 39 training batches came ready from "
                "the loader thread, 0 prepared ahead were dropped") != std::string::npos;
    EXPECT_EQ(said, prefetch == 1) << r.out << r.err;
    for (const auto& j : records(folder / "metrics.jsonl"))
      if (j.contains("loss")) loss[prefetch][j["step"].get<int>()] = j["loss"].get<double>();
  }
  ASSERT_EQ(loss[0].size(), 20u);
  EXPECT_EQ(loss[1], loss[0]);
}

}  // namespace
