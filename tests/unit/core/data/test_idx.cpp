#include "data_test_util.h"

#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/data/dataset.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>

namespace mixtrain::core {
namespace {

using test::Bytes;
using test::expect_data_error;
using test::ScratchDir;
using test::write_file;

void append_be32(Bytes& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<unsigned char>(v >> shift));
}

Bytes idx_bytes(std::uint8_t type, const std::vector<std::uint32_t>& dims, const Bytes& data) {
  Bytes out = {0, 0, type, static_cast<unsigned char>(dims.size())};
  for (auto d : dims) append_be32(out, d);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// A gzip file (header, deflate data, CRC-32 and length trailer) as gzip(1) writes it.
Bytes gzip(const Bytes& data) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY), Z_OK);
  Bytes out(deflateBound(&z, data.size()));
  z.next_in = const_cast<unsigned char*>(data.data());
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

class Idx : public ::testing::Test {
 protected:
  static constexpr std::uint32_t kRows = 5, kH = 3, kW = 4;

  static Bytes pixels() {
    Bytes p(kRows * kH * kW);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<unsigned char>((i * 37) % 256);
    return p;
  }
  static Bytes labels() { return {3, 0, 9, 1, 3}; }

  void write_valid() {
    write_file(images_, idx_bytes(0x08, {kRows, kH, kW}, pixels()));
    write_file(labels_, idx_bytes(0x08, {kRows}, labels()));
  }
  void expect_images_error(const std::vector<std::string>& contains) {
    expect_data_error([&] { load_idx(images_, labels_); }, images_.string(), contains);
  }
  void expect_labels_error(const std::vector<std::string>& contains) {
    expect_data_error([&] { load_idx(images_, labels_); }, labels_.string(), contains);
  }

  ScratchDir dir_;
  test::fs::path images_ = dir_ / "images-idx3-ubyte", labels_ = dir_ / "labels-idx1-ubyte";
};

TEST_F(Idx, RoundTrip) {
  write_valid();
  const Dataset d = load_idx(images_, labels_);
  ASSERT_EQ(d.rows, 5);
  ASSERT_EQ(d.features, 12);
  EXPECT_EQ(d.classes, 10);
  const Bytes p = pixels();
  for (std::size_t i = 0; i < p.size(); ++i) ASSERT_EQ(d.x[i], static_cast<float>(p[i]) / 255.0f);
  EXPECT_EQ(d.y, (std::vector<std::int32_t>{3, 0, 9, 1, 3}));
  for (float v : d.x) ASSERT_TRUE(v >= 0.0f && v <= 1.0f);
  EXPECT_EQ(load_idx(images_, labels_, 12).classes, 12);
}

TEST_F(Idx, FlatAndChannelImagesAreAccepted) {
  write_valid();
  write_file(images_, idx_bytes(0x08, {kRows, kH * kW}, pixels()));
  EXPECT_EQ(load_idx(images_, labels_).features, 12);
  write_file(images_, idx_bytes(0x08, {kRows, kH, 2, 2}, pixels()));
  EXPECT_EQ(load_idx(images_, labels_).features, 12);
}

// Loaded as a source, a rank-4 file that reads as many channels of a few pixels (a channels-first
// array written as IDX) is refused naming the file and what it read; a usual one loads.
TEST_F(Idx, AChannelsFirstRankFourFileIsRefusedAsASource) {
  write_valid();
  DataSettings s;
  s.source = DataSource::idx;
  s.images_path = images_;
  s.labels_path = labels_;
  s.eval_fraction = 0.0;
  // [N, 3, 4]: 1 channel of 3x4, usual.
  EXPECT_EQ(load_data(s, 1).train.channels(), 1);
  // 12 values a sample as [N, 2, 1, 6]: 6 channels of 2x1 pixels.
  write_file(images_, idx_bytes(0x08, {kRows, 2, 1, 6}, pixels()));
  expect_data_error([&] { load_data(s, 1); }, images_.string(),
                    {"6 channels of 2×1 pixels", "channels-first"});
}

TEST_F(Idx, MissingFile) {
  expect_images_error({"no such file"});
}

TEST_F(Idx, BadMagic) {
  write_valid();
  write_file(images_, idx_bytes(0x08, {kRows, kH, kW}, pixels()));
  Bytes bad = idx_bytes(0x08, {kRows, kH, kW}, pixels());
  bad[0] = 0x12;
  write_file(images_, bad);
  expect_images_error({"bad magic", "0x00000803", "0x12000803"});
  write_file(images_, idx_bytes(0x0D, {kRows, kH, kW}, Bytes(kRows * kH * kW * 4, 0)));
  expect_images_error({"unsigned byte", "0x00000d03"});
  write_file(images_, Bytes{0x1f, 0x8b, 8, 0, 0, 0});  // a gzip header cut short
  expect_images_error({"truncated gzip"});
  write_file(images_, Bytes{0, 0});
  expect_images_error({"too small"});
}

TEST_F(Idx, SwappedFilesAreWrongRank) {
  write_valid();
  expect_data_error([&] { load_idx(labels_, images_); }, labels_.string(),
                    {"rank 1", "0x00000803"});
}

TEST_F(Idx, TruncatedAndTrailing) {
  write_valid();
  Bytes full = idx_bytes(0x08, {kRows, kH, kW}, pixels());
  write_file(images_, Bytes(full.begin(), full.end() - 1));
  expect_images_error({"truncated", "60 bytes"});
  write_file(images_, Bytes(full.begin(), full.begin() + 10));  // inside the dimensions
  expect_images_error({"truncated"});
  full.push_back(7);
  write_file(images_, full);
  expect_images_error({"unexpected bytes"});
  write_file(images_, idx_bytes(0x08, {0xffffffffu, 0xffffffffu, 0xffffffffu}, {}));
  expect_images_error({"truncated"});
}

TEST_F(Idx, ZeroRowsAndMismatch) {
  write_valid();
  write_file(images_, idx_bytes(0x08, {0, kH, kW}, {}));
  expect_images_error({"zero rows"});
  write_valid();
  write_file(labels_, idx_bytes(0x08, {kRows - 1}, {1, 2, 3, 4}));
  expect_data_error([&] { load_idx(images_, labels_); }, labels_.string(), {"5 rows", "4"});
}

TEST_F(Idx, GzipFilesLoadLikeTheirContents) {
  write_valid();
  const Dataset plain = load_idx(images_, labels_);
  const auto images_gz = dir_ / "images-idx3-ubyte.gz", labels_gz = dir_ / "labels-idx1-ubyte.gz";
  write_file(images_gz, gzip(idx_bytes(0x08, {kRows, kH, kW}, pixels())));
  write_file(labels_gz, gzip(idx_bytes(0x08, {kRows}, labels())));
  const Dataset gz = load_idx(images_gz, labels_gz);
  EXPECT_EQ(gz.rows, plain.rows);
  EXPECT_EQ(gz.features, plain.features);
  EXPECT_EQ(gz.classes, plain.classes);
  EXPECT_EQ(gz.x, plain.x);
  EXPECT_EQ(gz.y, plain.y);
  // Recognised by the magic bytes, not the name: a compressed file without .gz, and a plain
  // file called .gz, both load.
  write_file(images_, gzip(idx_bytes(0x08, {kRows, kH, kW}, pixels())));
  write_file(labels_gz, idx_bytes(0x08, {kRows}, labels()));
  const Dataset swapped = load_idx(images_, labels_gz);
  EXPECT_EQ(swapped.x, plain.x);
  EXPECT_EQ(swapped.y, plain.y);
}

TEST_F(Idx, GzipTruncatedOrCorruptIsADataError) {
  write_valid();
  const Bytes full = gzip(idx_bytes(0x08, {kRows, kH, kW}, pixels()));
  for (std::size_t keep : {std::size_t{12}, full.size() / 2, full.size() - 8, full.size() - 1}) {
    write_file(images_, Bytes(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(keep)));
    SCOPED_TRACE("kept " + std::to_string(keep) + " of " + std::to_string(full.size()) + " bytes");
    expect_images_error({"truncated"});
  }
  Bytes bad_crc = full;
  bad_crc[bad_crc.size() - 6] ^= 0x40;  // inside the CRC-32 of the trailer
  write_file(images_, bad_crc);
  expect_images_error({"corrupt gzip data"});
}

TEST_F(Idx, GzipSizesAreBoundedByTheHeader) {
  write_valid();
  // A header that declares more than the data holds.
  write_file(images_, gzip(idx_bytes(0x08, {kRows + 1, kH, kW}, pixels())));
  expect_images_error({"truncated", "72 bytes", "has 60"});
  // More data than the header declares: decompression stops after the declared size.
  Bytes more = pixels();
  more.resize(more.size() + (std::size_t{4} << 20), 0);  // 4 MiB of zeros: a few KiB compressed
  const Bytes bomb = gzip(idx_bytes(0x08, {kRows, kH, kW}, more));
  ASSERT_LT(bomb.size(), std::size_t{64} << 10);
  write_file(images_, bomb);
  expect_images_error({"unexpected bytes"});
  // A header claiming more than deflate can expand the file to is refused before decompressing.
  write_file(images_, gzip(idx_bytes(0x08, {60000, 10000, 10000}, pixels())));
  expect_images_error({"more than a gzip file of", "can decompress to"});
  // A damaged header inside a valid gzip stream gets the plain file's message.
  Bytes bad = idx_bytes(0x08, {kRows, kH, kW}, pixels());
  bad[0] = 0x12;
  write_file(images_, gzip(bad));
  expect_images_error({"bad magic", "0x12000803"});
}

TEST_F(Idx, LabelBeyondDeclaredClasses) {
  write_valid();
  expect_data_error([&] { load_idx(images_, labels_, 5); }, labels_.string(),
                    {"label 9", "5 classes"});
}

}  // namespace
}  // namespace mixtrain::core
