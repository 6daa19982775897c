// TFRecord framing, the container of TensorBoard event files: each record is its length (uint64,
// little-endian), the masked CRC-32C of those 8 bytes, the data, and the masked CRC-32C of the
// data. Readers check both checksums and stop at a torn record, so a run killed mid-write keeps
// every whole record before it. Internal to the core; pure functions, no errors, except
// TfRecordReader, which reads a file record by record (sdk::UserError when it cannot open it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace mixtrain::core {

// CRC-32C (Castagnoli) of `data`, computed with Boost.CRC.
std::uint32_t crc32c(std::string_view data);
// The CRC rotated and offset as TFRecord stores it: a CRC of data that holds CRCs stays useful.
std::uint32_t masked_crc32c(std::string_view data);
// One whole record around `data`: 8 + 4 + data.size() + 4 bytes.
std::string tfrecord_frame(std::string_view data);
// The data of each whole record of `bytes`, in order, up to the first torn record or the first
// whose checksums do not match (what a reader keeps of a file a killed run left). The views
// point into `bytes`.
std::vector<std::string_view> tfrecord_records(std::string_view bytes);

// The records tfrecord_records() gives of a file's bytes, one at a time: a reader of a long run's
// event files holds one record, not the file.
class TfRecordReader {
 public:
  explicit TfRecordReader(const std::filesystem::path& file);
  // The next whole record's data, valid until the next call; nullptr after the last whole one.
  const std::string* next();

 private:
  std::ifstream in_;
  std::uint64_t left_ = 0;  // bytes not yet read
  std::string data_;
};

}  // namespace mixtrain::core
