#include "runs/tfrecord.h"

#include <boost/crc.hpp>

namespace mixtrain::core {

namespace {

// TFRecord's mask: rotate right by 15 bits, then add a constant.
constexpr std::uint32_t kMaskDelta = 0xa282ead8u;

void append_le(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
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

}  // namespace mixtrain::core
