// TFRecord framing (runs/tfrecord.h) against known answers: Boost.CRC documents CRC-32C's check
// value 0xE3069283 for "123456789"; the masked values below follow from it by TFRecord's mask
// ((crc >> 15 | crc << 17) + 0xa282ead8), and agree with TensorBoard's own masked_crc32c.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "little_endian.h"
#include "runs/tfrecord.h"

namespace {

using mixtrain::test::read_le;

using mixtrain::core::crc32c;
using mixtrain::core::masked_crc32c;
using mixtrain::core::tfrecord_frame;
using mixtrain::core::tfrecord_records;
using mixtrain::core::TfRecordReader;

TEST(TfRecord, Crc32cMatchesTheCheckValue) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
}

TEST(TfRecord, MaskRotatesAndOffsetsTheCrc) {
  EXPECT_EQ(masked_crc32c("123456789"), 0xC78AB0E5u);
  EXPECT_EQ(masked_crc32c(""), 0xA282EAD8u);  // CRC-32C of nothing is 0: only the offset
}

TEST(TfRecord, FrameHoldsLengthChecksumsAndData) {
  const std::string f = tfrecord_frame("123456789");
  ASSERT_EQ(f.size(), 8u + 4u + 9u + 4u);
  EXPECT_EQ(read_le(f, 0, 8), 9u);
  EXPECT_EQ(read_le(f, 8, 4), 0x3971F937u);  // masked CRC-32C of the 8 length bytes
  EXPECT_EQ(f.substr(12, 9), "123456789");
  EXPECT_EQ(read_le(f, 21, 4), 0xC78AB0E5u);
}

TEST(TfRecord, EmptyRecordIsSixteenBytes) {
  const std::string f = tfrecord_frame("");
  ASSERT_EQ(f.size(), 16u);
  EXPECT_EQ(read_le(f, 0, 8), 0u);
  EXPECT_EQ(read_le(f, 8, 4), 0x07980329u);
  EXPECT_EQ(read_le(f, 12, 4), 0xA282EAD8u);
}

TEST(TfRecord, DataWithZeroBytesIsKeptWhole) {
  const std::string data("a\0b", 3);
  const std::string f = tfrecord_frame(data);
  EXPECT_EQ(read_le(f, 0, 8), 3u);
  EXPECT_EQ(f.substr(12, 3), data);
  EXPECT_EQ(read_le(f, 15, 4), masked_crc32c(data));
}

// The file reader keeps what tfrecord_records() keeps of the same bytes: every whole record up to
// a torn last one (a killed run), or up to a damaged one, whose later records are not trusted.
TEST(TfRecord, TheFileReaderKeepsWhatTheRecordsOfItsBytesAre) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("mixtrain-tfrecord-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string whole = tfrecord_frame("first") + tfrecord_frame(std::string("\0two", 4)) +
                            tfrecord_frame("") + tfrecord_frame(std::string(70000, 'x'));
  std::string damaged = whole;
  damaged[tfrecord_frame("first").size() + 13] ^= 1;  // a byte of the second record's data
  std::string bad_length = whole;
  bad_length[tfrecord_frame("first").size()] = '\x7f';  // its length, checksum unchanged
  const std::vector<std::string> cases = {
      whole, whole.substr(0, whole.size() - 1), whole.substr(0, 20), damaged, bad_length, ""};
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const auto file = dir / ("case" + std::to_string(c));
    std::ofstream(file, std::ios::binary) << cases[c];
    std::vector<std::string> expected;
    for (const auto r : tfrecord_records(cases[c])) expected.emplace_back(r);
    std::vector<std::string> read;
    TfRecordReader reader(file);
    while (const std::string* r = reader.next()) read.push_back(*r);
    EXPECT_EQ(read, expected) << "case " << c;
    EXPECT_EQ(reader.next(), nullptr) << "case " << c;
  }
  EXPECT_EQ(tfrecord_records(cases[0]).size(), 4u);
  EXPECT_EQ(tfrecord_records(cases[1]).size(), 3u);
  EXPECT_EQ(tfrecord_records(cases[3]).size(), 1u);
  std::filesystem::remove_all(dir);
}

}  // namespace
