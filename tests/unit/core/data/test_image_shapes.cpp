// Image shape metadata: what each loader gives as sample_shape (IDX 3-D / 4-D, .npy uint8 and
// float32 images), that splits and gathers keep it, and that check_dataset checks it.
#include "data_test_util.h"

#include "mixtrain/core/data/dataset.h"

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

using Shape = std::vector<std::int64_t>;

Bytes idx_bytes(const std::vector<std::uint32_t>& dims, const Bytes& data) {
  Bytes out = {0, 0, 0x08, static_cast<unsigned char>(dims.size())};
  for (auto d : dims)
    for (int shift = 24; shift >= 0; shift -= 8)
      out.push_back(static_cast<unsigned char>(d >> shift));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

Bytes counting(std::size_t n) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(i % 251);
  return b;
}

TEST(ImageShapes, IdxThreeDimensionsIsOneChannel) {
  ScratchDir dir;
  write_file(dir / "x", idx_bytes({2, 3, 4}, counting(24)));
  write_file(dir / "y", idx_bytes({2}, {1, 0}));
  const Dataset d = load_idx(dir / "x", dir / "y");
  EXPECT_EQ(d.sample_shape, (Shape{1, 3, 4}));
  EXPECT_TRUE(d.is_image());
  write_file(dir / "x", idx_bytes({2, 12}, counting(24)));
  EXPECT_TRUE(load_idx(dir / "x", dir / "y").sample_shape.empty());
}

// [N, H, W, C] is permuted to channels-first: x[n, c, h, w] = file[n, h, w, c] / 255.
TEST(ImageShapes, IdxChannelsLastIsPermutedToChannelsFirst) {
  ScratchDir dir;
  const std::uint32_t N = 2, H = 3, W = 4, C = 2;
  const Bytes pixels = counting(N * H * W * C);
  write_file(dir / "x", idx_bytes({N, H, W, C}, pixels));
  write_file(dir / "y", idx_bytes({N}, {1, 0}));
  const Dataset d = load_idx(dir / "x", dir / "y");
  ASSERT_EQ(d.sample_shape, (Shape{2, 3, 4}));
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t w = 0; w < W; ++w)
          ASSERT_EQ(d.x[((n * C + c) * H + h) * W + w],
                    static_cast<float>(pixels[((n * H + h) * W + w) * C + c]) / 255.0f);
}

TEST(ImageShapes, IdxWrongMagicIsADataErrorNamingTheFile) {
  ScratchDir dir;
  Bytes bad = idx_bytes({2, 3, 4, 1}, counting(24));
  bad[1] = 0x07;
  write_file(dir / "x", bad);
  write_file(dir / "y", idx_bytes({2}, {1, 0}));
  expect_data_error([&] { load_idx(dir / "x", dir / "y"); }, (dir / "x").string(),
                    {"bad magic", "0x00070804"});
}

TEST(ImageShapes, NpyUint8AndFloat32ImagesKeepTheirShape) {
  ScratchDir dir;
  const auto x = dir / "x.npy", y = dir / "y.npy";
  write_file(y, npy_bytes(npy_dict("<i8", {2}), le_array(std::vector<std::int64_t>{0, 1})));
  const Bytes pixels = counting(2 * 3 * 2 * 2);
  write_file(x, npy_bytes(npy_dict("|u1", {2, 3, 2, 2}), pixels));
  const Dataset u8 = load_npy(x, y);
  EXPECT_EQ(u8.sample_shape, (Shape{3, 2, 2}));
  for (std::size_t i = 0; i < pixels.size(); ++i)
    ASSERT_EQ(u8.x[i], static_cast<float>(pixels[i]) / 255.0f);
  std::vector<float> values(24);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  write_file(x, npy_bytes(npy_dict("<f4", {2, 3, 2, 2}), le_array(values)));
  const Dataset f32 = load_npy(x, y);
  EXPECT_EQ(f32.sample_shape, (Shape{3, 2, 2}));
  EXPECT_EQ(f32.x, values);
  write_file(x, npy_bytes(npy_dict("<f4", {2, 3, 4}), le_array(values)));
  EXPECT_EQ(load_npy(x, y).sample_shape, (Shape{1, 3, 4}));
  write_file(x, npy_bytes(npy_dict("<f4", {2, 12}), le_array(values)));
  EXPECT_TRUE(load_npy(x, y).sample_shape.empty());
  write_file(x, npy_bytes(npy_dict("<f4", {2, 1, 3, 2, 2}), le_array(values)));
  const Dataset five = load_npy(x, y);
  EXPECT_TRUE(five.sample_shape.empty());
  EXPECT_EQ(five.features, 12);
}

// data.npy.layout = "nhwc": [N, H, W, C] uint8 (torchvision's CIFAR-10 .data) becomes
// channels-first, scaled by /255 as ToTensor scales; ranks other than 4 are unaffected.
TEST(ImageShapes, NpyChannelsLastIsPermutedToChannelsFirst) {
  ScratchDir dir;
  const std::uint64_t N = 2, H = 3, W = 5, C = 3;
  const Bytes pixels = counting(N * H * W * C);
  write_file(dir / "x.npy", npy_bytes(npy_dict("|u1", {N, H, W, C}), pixels));
  write_file(dir / "y.npy", npy_bytes(npy_dict("<i8", {N}), le_array<std::int64_t>({1, 0})));
  const Dataset d = load_npy(dir / "x.npy", dir / "y.npy", 0, /*channels_last=*/true);
  ASSERT_EQ(d.sample_shape, (Shape{3, 3, 5}));
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t w = 0; w < W; ++w)
          ASSERT_EQ(d.x[((n * C + c) * H + h) * W + w],
                    static_cast<float>(pixels[((n * H + h) * W + w) * C + c]) / 255.0f);
  // Read channels-first (the default), the file's [3, 5, 3] samples are taken as {C, H, W} and
  // the pixels stay in file order.
  const Dataset first = load_npy(dir / "x.npy", dir / "y.npy");
  EXPECT_EQ(first.sample_shape, (Shape{3, 5, 3}));
  EXPECT_EQ(first.x[1], static_cast<float>(pixels[1]) / 255.0f);
  // One-channel [N, H, W] arrays have no channel axis to move.
  write_file(dir / "g.npy", npy_bytes(npy_dict("|u1", {N, H, W}), counting(N * H * W)));
  EXPECT_EQ(load_npy(dir / "g.npy", dir / "y.npy", 0, true).x,
            load_npy(dir / "g.npy", dir / "y.npy").x);
}

// Images whose reading gives many channels of tiny pictures are refused naming the layout key.
TEST(ImageShapes, ImplausibleImagesNameTheShapeAndTheOtherLayout) {
  Dataset cifar_read_first;
  cifar_read_first.rows = 1;
  cifar_read_first.features = 32 * 32 * 3;
  cifar_read_first.sample_shape = {32, 32, 3};
  const sdk::SourceLocation where{"cfg.toml", 7, 1};
  try {
    check_image_plausible(cifar_read_first, "x.npy", false, where, "data.npy.layout");
    ADD_FAILURE() << "[N, 32, 32, 3] read channels-first passed";
  } catch (const sdk::ConfigError& e) {
    const std::string m = e.full_message();
    EXPECT_NE(m.find("[N, 32, 32, 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("data.npy.layout = \"nhwc\""), std::string::npos) << m;
    EXPECT_NE(m.find("cfg.toml:7:1"), std::string::npos) << m;
  }
  Dataset first_read_last = cifar_read_first;
  first_read_last.sample_shape = {32, 3, 32};  // [N, 3, 32, 32] read channels-last
  try {
    check_image_plausible(first_read_last, "x.npy", true, where, "data.npy.layout");
    ADD_FAILURE() << "[N, 3, 32, 32] read channels-last passed";
  } catch (const sdk::ConfigError& e) {
    EXPECT_NE(e.full_message().find("\"nchw\""), std::string::npos) << e.full_message();
  }
  // Plausible images (1, 3 or 4 channels, or larger pictures) and plain features pass.
  for (const Shape& ok : {Shape{3, 32, 32}, Shape{1, 28, 28}, Shape{4, 2, 2}, Shape{16, 8, 8}}) {
    Dataset d;
    d.rows = 1;
    d.features = ok[0] * ok[1] * ok[2];
    d.sample_shape = ok;
    EXPECT_NO_THROW(check_image_plausible(d, "x.npy", false, where, "data.npy.layout"));
  }
  Dataset flat;
  flat.rows = 1;
  flat.features = 96;
  EXPECT_NO_THROW(check_image_plausible(flat, "x.npy", false, where, "data.npy.layout"));
}

TEST(ImageShapes, NpyLabelOutOfRangeNamesTheFileAndTheOffset) {
  ScratchDir dir;
  const auto x = dir / "x.npy", y = dir / "y.npy";
  write_file(x, npy_bytes(npy_dict("|u1", {3, 1, 2, 2}), counting(12)));
  write_file(y, npy_bytes(npy_dict("<i4", {3}), le_array(std::vector<std::int32_t>{0, 7, 1})));
  const std::size_t start = test::read_file(y).size() - 12;  // the 3 int32 labels end the file
  expect_data_error([&] { load_npy(x, y, 5); }, y.string(),
                    {"label 7", "row 1", "byte offset " + std::to_string(start + 4), "5 classes"});
  write_file(y, npy_bytes(npy_dict("<i4", {3}), le_array(std::vector<std::int32_t>{0, 1, -2})));
  expect_data_error([&] { load_npy(x, y); }, y.string(),
                    {"label -2", "row 2", "byte offset " + std::to_string(start + 8)});
}

Dataset image_rows(std::int64_t rows) {
  Dataset d;
  d.rows = rows;
  d.features = 2 * 2 * 3;
  d.classes = 3;
  d.sample_shape = {2, 2, 3};
  for (std::int64_t r = 0; r < rows; ++r) {
    d.y.push_back(static_cast<std::int32_t>(r % 3));
    for (std::int64_t j = 0; j < d.features; ++j) d.x.push_back(static_cast<float>(r * 100 + j));
  }
  return d;
}

TEST(ImageShapes, SplitAndGatherKeepTheShape) {
  auto [train, eval] = split_holdout(image_rows(20), 0.25, 3);
  EXPECT_EQ(train.sample_shape, (Shape{2, 2, 3}));
  EXPECT_EQ(eval.sample_shape, (Shape{2, 2, 3}));
  EXPECT_NO_THROW(check_dataset(train, "train"));
  EXPECT_NO_THROW(check_dataset(eval, "eval"));
  auto [all, none] = split_holdout(image_rows(5), 0.0, 3);
  EXPECT_EQ(none.sample_shape, (Shape{2, 2, 3}));
  // A gathered row is the whole image, NCHW.
  std::vector<float> x(12);
  const std::vector<std::int64_t> rows = {0};
  gather_batch(eval, rows, x.data(), nullptr);
  const auto id = static_cast<std::int64_t>(x[0]) / 100;
  for (std::size_t j = 0; j < 12; ++j)
    EXPECT_EQ(x[j], static_cast<float>(id * 100 + static_cast<std::int64_t>(j)));
}

TEST(ImageShapes, CheckDatasetChecksTheProduct) {
  Dataset d = image_rows(2);
  d.sample_shape = {2, 2, 2};
  expect_data_error([&] { check_dataset(d, "shaped"); }, "shaped", {"[2, 2, 2]", "12 features"});
  d.sample_shape = {12};
  expect_data_error([&] { check_dataset(d, "shaped"); }, "shaped", {"[C, H, W]"});
  d.sample_shape = {0, 2, 6};
  expect_data_error([&] { check_dataset(d, "shaped"); }, "shaped");
  d.sample_shape = {-1, -2, 6};
  expect_data_error([&] { check_dataset(d, "shaped"); }, "shaped");
  d.sample_shape = {std::int64_t{1} << 40, std::int64_t{1} << 40, 12};
  expect_data_error([&] { check_dataset(d, "shaped"); }, "shaped");
  d.sample_shape = {3, 2, 2};
  EXPECT_NO_THROW(check_dataset(d, "shaped"));
}

}  // namespace
}  // namespace mixtrain::core
