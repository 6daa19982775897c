#include "runs/tfrecord.h"

#include <boost/crc.hpp>

namespace mixtrain::core {

namespace {

// TFRecord's mask: rotate right by 15 bits, then add a constant.
constexpr std::uint32_t kMaskDelta = 0xa282ead8u;

void append_le(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
}

std::uint64_t read_le(std::string_view in, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  return v;
}

}  // namespace

std::uint32_t crc32c(std::string_view data) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data.data(), data.size());
  return crc.checksum();
}

std::uint32_t masked_crc32c(std::string_view data) {
  const std::uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

std::string tfrecord_frame(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  append_le(out, data.size(), 8);
  append_le(out, masked_crc32c(out), 4);
  out.append(data);
  append_le(out, masked_crc32c(data), 4);
  return out;
}

std::vector<std::string_view> tfrecord_records(std::string_view bytes) {
  std::vector<std::string_view> out;
  std::size_t at = 0;
  while (bytes.size() - at >= 16) {
    const std::uint64_t length = read_le(bytes, at, 8);
    if (read_le(bytes, at + 8, 4) != masked_crc32c(bytes.substr(at, 8))) break;
    if (length > bytes.size() - at - 16) break;  // torn: the run stopped mid-record
    const auto data = bytes.substr(at + 12, length);
    if (read_le(bytes, at + 12 + length, 4) != masked_crc32c(data)) break;
    out.push_back(data);
    at += 16 + length;
  }
  return out;
}

}  // namespace mixtrain::core
