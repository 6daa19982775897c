#include "runs/tfrecord.h"

#include <optional>

#include <boost/crc.hpp>

#include "mixtrain/sdk/error.h"

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

// The data length a record's 12-byte header states, when its checksum holds and the record fits
// the `available` bytes from its start (else it is torn or damaged: reading stops there).
std::optional<std::uint64_t> record_length(std::string_view header, std::uint64_t available) {
  const std::uint64_t length = read_le(header, 0, 8);
  if (read_le(header, 8, 4) != masked_crc32c(header.substr(0, 8))) return std::nullopt;
  if (available < 16 || length > available - 16) return std::nullopt;
  return length;
}

// Whether the 4 bytes after a record's data are the data's masked checksum.
bool data_intact(std::string_view data, std::string_view crc) {
  return read_le(crc, 0, 4) == masked_crc32c(data);
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
    const auto length = record_length(bytes.substr(at, 12), bytes.size() - at);
    if (!length) break;  // torn (the run stopped mid-record) or damaged
    const auto data = bytes.substr(at + 12, *length);
    if (!data_intact(data, bytes.substr(at + 12 + *length, 4))) break;
    out.push_back(data);
    at += 16 + *length;
  }
  return out;
}

TfRecordReader::TfRecordReader(const std::filesystem::path& file) : in_(file, std::ios::binary) {
  std::error_code ec;
  left_ = std::filesystem::file_size(file, ec);
  if (!in_ || ec)
    throw sdk::UserError("cannot read " + file.string(), "check the run folder's permissions");
}

const std::string* TfRecordReader::next() {
  // tfrecord_records()' rule, read from the file: a length past the bytes left is a torn record,
  // so a damaged length never sizes the buffer beyond the file. The first bad record ends it.
  const auto end = [&]() -> const std::string* {
    left_ = 0;
    return nullptr;
  };
  if (left_ < 16) return end();
  char head[12];
  if (!in_.read(head, sizeof head)) return end();
  const auto length = record_length(std::string_view(head, sizeof head), left_);
  if (!length) return end();
  data_.resize(*length);
  char tail[4];
  if (!in_.read(data_.data(), static_cast<std::streamsize>(*length)) || !in_.read(tail, 4))
    return end();
  if (!data_intact(data_, std::string_view(tail, 4))) return end();
  left_ -= 16 + *length;
  return &data_;
}

}  // namespace mixtrain::core
