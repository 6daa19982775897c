// load_prediction_input (`mixtrain predict`'s inputs): image layouts against the model's shape,
// flat rows, labels, normalisation, token windows and which of them are labelled, and the errors
// that name the fix. The files are written by the raw writers of data_test_util.h.
#include "data_test_util.h"

#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/data/prediction_input.h"

#include <gtest/gtest.h>

namespace mixtrain::core {
namespace {

using test::Bytes;
using test::expect_data_error;
using test::le_array;
using test::npy_bytes;
using test::npy_dict;
using test::ScratchDir;
using test::write_file;

namespace fs = std::filesystem;
using Shape = std::vector<std::int64_t>;

// The model's training split: only its form, shape and classes matter here.
Dataset trained_images(std::int64_t c, std::int64_t h, std::int64_t w, std::int32_t classes) {
  Dataset d;
  d.rows = 1;
  d.features = c * h * w;
  d.classes = classes;
  d.sample_shape = {c, h, w};
  return d;
}

std::vector<float> counting(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

PredictionInput load(const fs::path& input, const Dataset& trained,
                     ImageLayout layout = ImageLayout::automatic, const fs::path& labels = {},
                     const ChannelStats& stats = {}) {
  PredictionInputSpec spec;
  spec.input = input;
  spec.labels = labels;
  spec.layout = layout;
  DataSettings settings;
  settings.source = DataSource::npy;
  return load_prediction_input(spec, settings, trained, stats);
}

TEST(PredictionInput, ChannelsLastImagesArePermutedToTheModelsChannelsFirstShape) {
  ScratchDir dir;
  // 2 images [H=2, W=3, C=4] channels-last; the model reads [4, 2, 3].
  const auto values = counting(2 * 2 * 3 * 4);
  write_file(dir / "x.npy", npy_bytes(npy_dict("<f4", {2, 2, 3, 4}), le_array(values)));
  const auto in = load(dir / "x.npy", trained_images(4, 2, 3, 10));
  EXPECT_EQ(in.data.sample_shape, (Shape{4, 2, 3}));
  EXPECT_EQ(in.labelled_rows, 0);
  EXPECT_NE(in.description.find("channels-last"), std::string::npos) << in.description;
  // x[n, c, h, w] = file[n, h, w, c]
  for (std::size_t n = 0; n < 2; ++n)
    for (std::size_t c = 0; c < 4; ++c)
      for (std::size_t h = 0; h < 2; ++h)
        for (std::size_t w = 0; w < 3; ++w)
          ASSERT_EQ(in.data.x[n * 24 + (c * 2 + h) * 3 + w], values[n * 24 + (h * 3 + w) * 4 + c])
              << n << c << h << w;
  // The same file read as the model's shape by name; channels-first refused with the fix.
  EXPECT_EQ(load(dir / "x.npy", trained_images(4, 2, 3, 10), ImageLayout::nhwc).data.x, in.data.x);
  expect_data_error([&] { load(dir / "x.npy", trained_images(4, 2, 3, 10), ImageLayout::nchw); },
                    "x.npy", {"[2, 3, 4]", "[4, 2, 3]", "--image-layout nhwc"});
}

TEST(PredictionInput, ChannelsFirstImagesAreReadAsTheyAre) {
  ScratchDir dir;
  const auto values = counting(2 * 3 * 4 * 5);
  write_file(dir / "x.npy", npy_bytes(npy_dict("<f4", {2, 3, 4, 5}), le_array(values)));
  const auto in = load(dir / "x.npy", trained_images(3, 4, 5, 10));
  EXPECT_EQ(in.data.sample_shape, (Shape{3, 4, 5}));
  EXPECT_EQ(in.data.x, values);
  expect_data_error([&] { load(dir / "x.npy", trained_images(3, 4, 5, 10), ImageLayout::nhwc); },
                    "x.npy", {"--image-layout nchw"});
}

TEST(PredictionInput, CubicSamplesAreAmbiguousUntilTheLayoutIsNamed) {
  ScratchDir dir;
  const auto values = counting(1 * 3 * 3 * 3);
  write_file(dir / "x.npy", npy_bytes(npy_dict("<f4", {1, 3, 3, 3}), le_array(values)));
  expect_data_error([&] { load(dir / "x.npy", trained_images(3, 3, 3, 10)); }, "x.npy",
                    {"both channels-first and channels-last", "--image-layout"});
  EXPECT_EQ(load(dir / "x.npy", trained_images(3, 3, 3, 10), ImageLayout::nchw).data.x, values);
  EXPECT_NE(load(dir / "x.npy", trained_images(3, 3, 3, 10), ImageLayout::nhwc).data.x, values);
}

TEST(PredictionInput, ImagesOfAnotherSizeNameBothShapes) {
  ScratchDir dir;
  // torchvision CIFAR-10 `.data` is [N, 32, 32, 3]; a model trained on 28×28 grey images.
  write_file(dir / "x.npy", npy_bytes(npy_dict("|u1", {2, 32, 32, 3}), Bytes(2 * 32 * 32 * 3, 7)));
  expect_data_error([&] { load(dir / "x.npy", trained_images(1, 28, 28, 10)); }, "x.npy",
                    {"[32, 32, 3]", "[1, 28, 28]"});
}

TEST(PredictionInput, FlatRowsAreChannelsFirstAndUint8IsScaledLikeToTensor) {
  ScratchDir dir;
  Bytes pixels(2 * 12);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<unsigned char>(i * 10);
  write_file(dir / "x.npy", npy_bytes(npy_dict("|u1", {2, 12}), pixels));
  const auto in = load(dir / "x.npy", trained_images(3, 2, 2, 10));
  EXPECT_EQ(in.data.sample_shape, (Shape{3, 2, 2}));
  for (std::size_t i = 0; i < pixels.size(); ++i)
    EXPECT_EQ(in.data.x[i], static_cast<float>(pixels[i]) / 255.0f);
}

TEST(PredictionInput, TheRunsNormalisationIsApplied) {
  ScratchDir dir;
  const auto values = counting(1 * 2 * 2 * 2);
  write_file(dir / "x.npy", npy_bytes(npy_dict("<f4", {1, 2, 2, 2}), le_array(values)));
  ChannelStats stats{{1.0, 2.0}, {0.5, 4.0}};
  const auto in = load(dir / "x.npy", trained_images(2, 2, 2, 10), ImageLayout::nchw, {}, stats);
  Dataset expected;
  expected.rows = 1;
  expected.features = 8;
  expected.x = values;
  expected.sample_shape = {2, 2, 2};
  normalize_channels(expected, stats);
  EXPECT_EQ(in.data.x, expected.x);
}

// A run that kept its images as bytes reads uint8 inputs as bytes too (a quarter of the memory of
// floats): they decode, normalised, to the floats a run that kept floats reads, bit for bit.
TEST(PredictionInput, ByteImagesStayBytesWhereTheRunKeptItsOwnAndDecodeToTheSameFloats) {
  ScratchDir dir;
  Bytes pixels(2 * 2 * 3 * 4);  // 2 images [H=2, W=3, C=4] channels-last
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<unsigned char>(i * 5);
  write_file(dir / "x.npy", npy_bytes(npy_dict("|u1", {2, 2, 3, 4}), pixels));
  const ChannelStats stats{{0.1, 0.2, 0.3, 0.4}, {0.5, 0.25, 2.0, 1.5}};
  const Dataset as_floats = trained_images(4, 2, 3, 10);
  Dataset as_bytes = as_floats;
  as_bytes.pixels.assign(static_cast<std::size_t>(as_bytes.features), 0);
  as_bytes.pixel_values.assign(4 * 256, 0.0f);
  const auto floats = load(dir / "x.npy", as_floats, ImageLayout::automatic, {}, stats);
  auto bytes = load(dir / "x.npy", as_bytes, ImageLayout::automatic, {}, stats);
  EXPECT_FALSE(floats.data.is_bytes());
  ASSERT_TRUE(bytes.data.is_bytes());
  EXPECT_TRUE(bytes.data.x.empty());
  EXPECT_EQ(bytes.data.sample_shape, (Shape{4, 2, 3}));
  EXPECT_EQ(bytes.description, floats.description);
  decode_pixels(bytes.data);
  EXPECT_EQ(bytes.data.x, floats.data.x);
}

TEST(PredictionInput, LabelsAreCheckedAgainstTheModelsClasses) {
  ScratchDir dir;
  Dataset trained;
  trained.rows = 1;
  trained.features = 3;
  trained.classes = 4;
  write_file(dir / "x.npy", npy_bytes(npy_dict("<f4", {2, 3}), le_array(counting(6))));
  write_file(dir / "y.npy", npy_bytes(npy_dict("<i8", {2}), le_array<std::int64_t>({3, 1})));
  const auto in = load(dir / "x.npy", trained, ImageLayout::automatic, dir / "y.npy");
  EXPECT_EQ(in.labelled_rows, 2);
  EXPECT_EQ(in.data.y, (std::vector<std::int32_t>{3, 1}));
  EXPECT_EQ(in.data.classes, 4);
  // A label past them: the model's classes are the checkpoint's, which no config raises.
  write_file(dir / "y.npy", npy_bytes(npy_dict("<i8", {2}), le_array<std::int64_t>({1, 4})));
  expect_data_error([&] { load(dir / "x.npy", trained, ImageLayout::automatic, dir / "y.npy"); },
                    "y.npy",
                    {"label 4 (row 1) does not fit the checkpoint's 4 classes", "labels 0 to 3"});
  try {
    load(dir / "x.npy", trained, ImageLayout::automatic, dir / "y.npy");
  } catch (const sdk::DataError& e) {
    EXPECT_EQ(e.full_message().find("config"), std::string::npos) << e.full_message();
  }
  // Features of another width: both counts named.
  write_file(dir / "x.npy", npy_bytes(npy_dict("<f4", {2, 5}), le_array(counting(10))));
  expect_data_error([&] { load(dir / "x.npy", trained); }, "x.npy", {"5 features", "3"});
}

TEST(PredictionInput, AFileOfNoKnownFormIsRefusedByName) {
  ScratchDir dir;
  write_file(dir / "x.csv", Bytes{'1', ',', '2', '\n'});
  Dataset trained;
  trained.rows = 1;
  trained.features = 2;
  trained.classes = 2;
  expect_data_error([&] { load(dir / "x.csv", trained); }, "x.csv", {".npy"});
  expect_data_error([&] { load(dir / "missing.npy", trained); }, "missing.npy");
}

// Windows of T tokens every stride; labelled while the next token exists.
TEST(PredictionInput, TokenWindowsAreLabelledWhileTheirNextTokenExists) {
  ScratchDir dir;
  Dataset trained;
  trained.rows = 1;
  trained.features = 4;  // T
  trained.classes = 256;
  trained.stride = 1;
  DataSettings settings;
  settings.source = DataSource::text;
  auto windows = [&](const std::string& text, std::int64_t stride) {
    write_file(dir / "t.txt", Bytes(text.begin(), text.end()));
    PredictionInputSpec spec;
    spec.input = dir / "t.txt";
    spec.stride = stride;
    return load_prediction_input(spec, settings, trained, {});
  };
  // 9 tokens, stride T = 4: windows at 0 and 4; the second ends at token 8, whose next exists.
  auto in = windows("abcdefghi", 0);
  EXPECT_EQ(in.data.rows, 2);
  EXPECT_EQ(in.labelled_rows, 2);
  // 8 tokens: windows at 0 and 4; the last one's next token is past the file.
  in = windows("abcdefgh", 0);
  EXPECT_EQ(in.data.rows, 2);
  EXPECT_EQ(in.labelled_rows, 1);
  std::vector<std::int32_t> ids(8), targets(8);
  const std::vector<std::int64_t> rows = {0, 1};
  gather_tokens(in.data, rows, ids.data(), targets.data());
  EXPECT_EQ(ids, (std::vector<std::int32_t>{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'}));
  EXPECT_EQ(targets[0], 'b');
  EXPECT_EQ(targets[3], 'e');
  // Exactly one window; stride 1 gives every window.
  in = windows("abcd", 0);
  EXPECT_EQ(in.data.rows, 1);
  EXPECT_EQ(in.labelled_rows, 0);
  in = windows("abcdefgh", 1);
  EXPECT_EQ(in.data.rows, 5);
  EXPECT_EQ(in.labelled_rows, 4);
  // Too short, a negative stride, and labels for a language model are refused with the fix.
  expect_data_error([&] { windows("abc", 0); }, "t.txt", {"3 tokens", "block size 4"});
  expect_data_error([&] { windows("abcdefgh", -2); }, "--stride", {"negative"});
  PredictionInputSpec spec;
  spec.input = dir / "t.txt";
  spec.labels = dir / "y.npy";
  expect_data_error([&] { load_prediction_input(spec, settings, trained, {}); }, "--labels",
                    {"language model"});
}

}  // namespace
}  // namespace mixtrain::core
