// Byte images (dataset.h): image files' pixels kept as bytes with a per-channel table. Every
// operation on them — loading, normalisation, statistics, the held-out split, the channels-last
// permute, augmentation, gathering — gives, decoded, exactly what the same data held as floats
// gives, so a run sees the same values whichever form its data take.
#include "data_test_util.h"

#include "mixtrain/core/data/dataset.h"
#include "mixtrain/sdk/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

namespace mixtrain::core {
namespace {

// `f` throws sdk::DataError whose message holds `part`: the message is the contract.
template <class F>
void expect_data_error_saying(F f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no DataError (expected one saying '" << part << "')";
  } catch (const sdk::DataError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

using test::Bytes;
using test::npy_bytes;
using test::npy_dict;
using test::ScratchDir;
using test::write_file;

// n CIFAR-10 records: label r mod 10, pixel i of the three planes = (r·13 + 7·i) mod 256.
Bytes cifar_records(std::size_t n) {
  Bytes out;
  for (std::size_t r = 0; r < n; ++r) {
    out.push_back(static_cast<unsigned char>(r % 10));
    for (std::size_t i = 0; i < 3072; ++i)
      out.push_back(static_cast<unsigned char>((r * 13 + 7 * i) % 256));
  }
  return out;
}

// The same CIFAR-10 file loaded both ways.
struct BothForms {
  Dataset bytes, floats;
};
BothForms load_both(std::size_t records) {
  ScratchDir dir;
  write_file(dir / "data_batch_1.bin", cifar_records(records));
  const std::vector<test::fs::path> files = {dir / "data_batch_1.bin"};
  return {load_cifar10(files, /*keep_bytes=*/true), load_cifar10(files)};
}

// Every row of `d` gathered (and decoded) as floats.
std::vector<float> decoded(const Dataset& d) {
  std::vector<std::int64_t> rows(static_cast<std::size_t>(d.rows));
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<float> out(static_cast<std::size_t>(d.rows * d.features));
  gather_batch(d, rows, out.data(), nullptr);
  return out;
}

TEST(ByteImages, LoadedBytesDecodeToTheFloatsAndTakeAQuarterOfTheMemory) {
  const auto [bytes, floats] = load_both(12);
  ASSERT_TRUE(bytes.is_bytes());
  EXPECT_FALSE(floats.is_bytes());
  EXPECT_TRUE(bytes.x.empty());
  EXPECT_EQ(bytes.pixels.size(), 12u * 3072u);
  EXPECT_EQ(bytes.pixel_values.size(), 3u * 256u);
  EXPECT_EQ(bytes.y, floats.y);
  EXPECT_EQ(decoded(bytes), floats.x);
  Dataset converted = bytes;
  decode_pixels(converted);
  EXPECT_FALSE(converted.is_bytes());
  EXPECT_TRUE(converted.pixels.empty());
  EXPECT_EQ(converted.x, floats.x);
}

TEST(ByteImages, StatisticsAndNormalisationMatchTheFloatsBitForBit) {
  auto [bytes, floats] = load_both(20);
  const ChannelStats from_bytes = channel_statistics(bytes),
                     from_floats = channel_statistics(floats);
  EXPECT_EQ(from_bytes.mean, from_floats.mean);
  EXPECT_EQ(from_bytes.std, from_floats.std);
  const std::vector<std::uint8_t> pixels_before = bytes.pixels;
  normalize_channels(bytes, from_bytes);
  normalize_channels(floats, from_floats);
  EXPECT_EQ(bytes.pixels, pixels_before);  // the table changed, the pixels did not
  EXPECT_NE(bytes.pixel_values[1], 1.0f / 255.0f);
  EXPECT_EQ(decoded(bytes), floats.x);
  check_dataset(bytes, "normalised byte images");
}

TEST(ByteImages, TheHeldOutSplitKeepsTheFormAndTheRows) {
  auto [bytes, floats] = load_both(30);
  auto [bytes_train, bytes_eval] = split_holdout(std::move(bytes), 0.2, 7);
  auto [float_train, float_eval] = split_holdout(std::move(floats), 0.2, 7);
  ASSERT_TRUE(bytes_train.is_bytes());
  ASSERT_TRUE(bytes_eval.is_bytes());
  EXPECT_EQ(bytes_train.rows, 24);
  EXPECT_EQ(bytes_train.pixels.size(), 24u * 3072u);
  EXPECT_EQ(bytes_train.y, float_train.y);
  EXPECT_EQ(bytes_eval.y, float_eval.y);
  EXPECT_EQ(decoded(bytes_train), float_train.x);
  EXPECT_EQ(decoded(bytes_eval), float_eval.x);
}

TEST(ByteImages, AugmentedBytesDecodeToTheAugmentedFloats) {
  auto [bytes, floats] = load_both(8);
  const ChannelStats stats = channel_statistics(floats);
  normalize_channels(bytes, stats);
  normalize_channels(floats, stats);
  // What a raw 0 pixel normalises to: the float form's crop fill (load_data's `black`).
  std::vector<float> black(3);
  for (std::size_t c = 0; c < 3; ++c)
    black[c] = normalized_pixel(0.0f, stats.mean[c], stats.std[c]);
  const AugmentSpec spec{.crop_padding = 4, .horizontal_flip = true};
  std::vector<std::int64_t> rows = {3, 0, 7, 7, 5};
  const auto n = static_cast<std::int64_t>(rows.size());
  std::vector<std::uint8_t> batch_bytes(rows.size() * 3072);
  std::vector<float> batch_floats(rows.size() * 3072), from_bytes(rows.size() * 3072);
  gather_pixels(bytes, rows, batch_bytes.data(), nullptr);
  gather_batch(floats, rows, batch_floats.data(), nullptr);
  augment_batch(spec, bytes.sample_shape, batch_bytes.data(), n, 11, 42);
  augment_batch(spec, floats.sample_shape, black, batch_floats.data(), n, 11, 42);
  for (std::size_t i = 0; i < from_bytes.size(); ++i)
    from_bytes[i] = bytes.pixel_values[(i % 3072) / 1024 * 256 + batch_bytes[i]];
  EXPECT_EQ(from_bytes, batch_floats);
  // Augmentation moved pixels (the comparison above is not of two untouched batches).
  std::vector<float> plain(rows.size() * 3072);
  gather_batch(floats, rows, plain.data(), nullptr);
  EXPECT_NE(plain, batch_floats);
}

TEST(ByteImages, ChannelsLastBytesArePermutedAsTheFloatsAre) {
  ScratchDir dir;
  Bytes pixels(6 * 5 * 4 * 3);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<unsigned char>(i * 37);
  write_file(dir / "x.npy", npy_bytes(npy_dict("|u1", {6, 5, 4, 3}), pixels));
  write_file(dir / "y.npy", npy_bytes(npy_dict("|u1", {6}), Bytes{0, 1, 2, 0, 1, 2}));
  const Dataset bytes = load_npy(dir / "x.npy", dir / "y.npy", 0, /*channels_last=*/true, true);
  const Dataset floats = load_npy(dir / "x.npy", dir / "y.npy", 0, /*channels_last=*/true);
  ASSERT_TRUE(bytes.is_bytes());
  EXPECT_EQ(bytes.sample_shape, (std::vector<std::int64_t>{3, 5, 4}));
  EXPECT_EQ(bytes.pixel_values.size(), 3u * 256u);
  EXPECT_EQ(decoded(bytes), floats.x);
  // The table is per channel, so normalising before the permute would mix channels up.
  Dataset normalised = bytes;
  normalised.sample_shape = {5, 4, 3};
  normalised.pixel_values.assign(5 * 256, 0.5f);
  EXPECT_THROW(channels_last_to_first(normalised), std::logic_error);
}

TEST(ByteImages, SyntheticImagesRoundedToBytes) {
  SyntheticSpec spec;
  spec.kind = "images";
  spec.rows = 40;
  spec.channels = 2;
  spec.height = spec.width = 8;
  spec.noise = 0.3;
  const Dataset floats = make_synthetic(spec);
  spec.byte_pixels = true;
  const Dataset bytes = make_synthetic(spec);
  ASSERT_TRUE(bytes.is_bytes());
  EXPECT_EQ(bytes.y, floats.y);
  const std::vector<float> values = decoded(bytes);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double want =
        std::floor(std::clamp(static_cast<double>(floats.x[i]), 0.0, 1.0) * 255.0 + 0.5);
    ASSERT_EQ(bytes.pixels[i], static_cast<std::uint8_t>(want)) << i;
    ASSERT_EQ(values[i], static_cast<float>(want) / 255.0f) << i;
  }
  spec.feature_scale = 2.0;
  expect_data_error_saying([&] { make_synthetic(spec); },
                           "'feature_scale' must be 1 for byte pixels");
  spec.feature_scale = 1.0;
  spec.kind = "clusters";
  expect_data_error_saying([&] { make_synthetic(spec); },
                           "needs kind = \"images\", found \"clusters\"");
}

TEST(ByteImages, ADamagedTableOrPixelCountIsRefused) {
  const auto [bytes, floats] = load_both(2);
  Dataset short_table = bytes;
  short_table.pixel_values.resize(2 * 256);
  expect_data_error_saying([&] { check_dataset(short_table, "test"); },
                           "a table of C x 256 values (found 512 values)");
  Dataset infinite = bytes;
  infinite.pixel_values[256 + 9] = INFINITY;
  try {
    check_dataset(infinite, "test");
    FAIL() << "no error";
  } catch (const sdk::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("byte 9 of channel 1"), std::string::npos) << e.what();
  }
  Dataset missing = bytes;
  missing.pixels.pop_back();
  expect_data_error_saying([&] { check_dataset(missing, "test"); },
                           "features hold 6143 values, expected rows x features = 2 x 3072");
  Dataset both = bytes;
  both.x = floats.x;
  expect_data_error_saying([&] { check_dataset(both, "test"); }, "no float features");
  EXPECT_THROW(gather_pixels(floats, std::vector<std::int64_t>{0}, nullptr, nullptr),
               std::logic_error);
}

}  // namespace
}  // namespace mixtrain::core
