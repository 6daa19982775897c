// TFRecord framing (runs/tfrecord.h) against known answers: Boost.CRC documents CRC-32C's check
// value 0xE3069283 for "123456789"; the masked values below follow from it by TFRecord's mask
// ((crc >> 15 | crc << 17) + 0xa282ead8), and agree with TensorBoard's own masked_crc32c.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "little_endian.h"
#include "runs/tfrecord.h"

namespace {

using mixtrain::test::read_le;

using mixtrain::core::crc32c;
using mixtrain::core::masked_crc32c;
using mixtrain::core::tfrecord_frame;

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

}  // namespace
