// CIFAR-10 binary batches: records, shapes, scaling, the folder layout and bad files.
#include "data_test_util.h"

#include "mixtrain/core/data/dataset.h"

#include <gtest/gtest.h>

namespace mixtrain::core {
namespace {

using test::Bytes;
using test::expect_data_error;
using test::ScratchDir;
using test::write_file;

constexpr std::size_t kRecord = 3073, kPixels = 3072;

// Record r: label, then pixel i of the R, G, B planes = (r + 7·i) mod 256.
Bytes cifar_records(std::size_t n, std::size_t first = 0) {
  Bytes out;
  for (std::size_t r = first; r < first + n; ++r) {
    out.push_back(static_cast<unsigned char>(r % 10));
    for (std::size_t i = 0; i < kPixels; ++i)
      out.push_back(static_cast<unsigned char>((r + 7 * i) % 256));
  }
  return out;
}

TEST(Cifar10, RecordsBecomeChannelsFirstImagesInZeroOne) {
  ScratchDir dir;
  const auto a = dir / "data_batch_1.bin", b = dir / "data_batch_2.bin";
  write_file(a, cifar_records(3));
  write_file(b, cifar_records(2, 3));
  const std::vector<test::fs::path> files = {a, b};
  const Dataset d = load_cifar10(files);
  ASSERT_EQ(d.rows, 5);
  EXPECT_EQ(d.features, 3072);
  EXPECT_EQ(d.classes, 10);
  EXPECT_EQ(d.sample_shape, (std::vector<std::int64_t>{3, 32, 32}));
  EXPECT_EQ(d.y, (std::vector<std::int32_t>{0, 1, 2, 3, 4}));
  for (std::size_t r = 0; r < 5; ++r)
    for (std::size_t i = 0; i < kPixels; i += 97)
      ASSERT_EQ(d.x[r * kPixels + i], static_cast<float>((r + 7 * i) % 256) / 255.0f)
          << r << " " << i;
  // Channel-first: the green plane starts at 1024, pixel (row 2, col 5) of blue at 2048 + 69.
  EXPECT_EQ(d.x[1024], static_cast<float>((7 * 1024) % 256) / 255.0f);
  EXPECT_EQ(d.x[2048 + 2 * 32 + 5], static_cast<float>((7 * (2048 + 69)) % 256) / 255.0f);
}

TEST(Cifar10, FolderGivesTheTrainingBatchesPresentAndTheTestBatch) {
  ScratchDir dir;
  expect_data_error([&] { cifar10_files(dir / "nowhere"); }, "nowhere", {"no such folder"});
  expect_data_error([&] { cifar10_files(dir.path()); }, dir.path().string(),
                    {"data_batch_1.bin", "data_batch_5.bin"});
  write_file(dir / "data_batch_1.bin", cifar_records(1));
  write_file(dir / "data_batch_3.bin", cifar_records(1));
  expect_data_error([&] { cifar10_files(dir.path()); }, dir.path().string(), {"test_batch.bin"});
  write_file(dir / "test_batch.bin", cifar_records(1));
  const auto [train, eval] = cifar10_files(dir.path());
  EXPECT_EQ(train,
            (std::vector<test::fs::path>{dir / "data_batch_1.bin", dir / "data_batch_3.bin"}));
  EXPECT_EQ(eval, (std::vector<test::fs::path>{dir / "test_batch.bin"}));
}

TEST(Cifar10, TruncatedFileNamesTheFileAndWhereThePartialRecordStarts) {
  ScratchDir dir;
  const auto f = dir / "data_batch_1.bin";
  Bytes bytes = cifar_records(3);
  bytes.resize(2 * kRecord + 100);
  write_file(f, bytes);
  const std::vector<test::fs::path> files = {f};
  expect_data_error([&] { load_cifar10(files); }, f.string(),
                    {"truncated", "record 2", "byte offset 6146", "100 bytes"});
  write_file(f, {});
  expect_data_error([&] { load_cifar10(files); }, f.string(), {"empty"});
  expect_data_error([&] { load_cifar10(std::vector<test::fs::path>{dir / "missing.bin"}); },
                    "missing.bin", {"no such file"});
  test::expect_data_error([] { load_cifar10({}); }, "CIFAR-10", {"no batch files"});
}

// The neighbouring formats are named for what they are: CIFAR-100's binary records (3074 bytes,
// two label bytes) and the Python version's pickles are not "truncated" CIFAR-10 files.
TEST(Cifar10, Cifar100AndPickleFilesAreNamedNotCalledTruncated) {
  ScratchDir dir;
  const auto f = dir / "train.bin";
  write_file(f, Bytes(2 * (kRecord + 1), 3));
  const std::vector<test::fs::path> files = {f};
  expect_data_error([&] { load_cifar10(files); }, f.string(), {"CIFAR-100 binary format"});
  Bytes pickle = {0x80, 0x02, '}', 'q', 0x00};
  pickle.resize(1000, 0);
  write_file(f, pickle);
  expect_data_error([&] { load_cifar10(files); }, f.string(), {"Python pickle"});
}

TEST(Cifar10, LabelOutOfRangeNamesFileRecordAndOffset) {
  ScratchDir dir;
  const auto f = dir / "test_batch.bin";
  Bytes bytes = cifar_records(4);
  bytes[3 * kRecord] = 10;
  write_file(f, bytes);
  const std::vector<test::fs::path> files = {f};
  expect_data_error([&] { load_cifar10(files); }, f.string(),
                    {"record 3", "byte offset 9219", "label 10"});
}

}  // namespace
}  // namespace mixtrain::core
