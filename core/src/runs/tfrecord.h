// TFRecord framing, the container of TensorBoard event files: each record is its length (uint64,
// little-endian), the masked CRC-32C of those 8 bytes, the data, and the masked CRC-32C of the
// data. Readers check both checksums and stop at a torn record, so a run killed mid-write keeps
// every whole record before it. Internal to the core; pure functions, no errors.
#pragma once

#include <cstdint>
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

}  // namespace mixtrain::core
