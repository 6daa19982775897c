// On-disk layout of a mixtrain native checkpoint (.mxt), format version 1.
//
// Contract: constants and byte-level helpers shared by the reader, the writer and the tests that
// craft damaged files. All integers are little-endian whatever the host's byte order. Nothing here
// does I/O, allocates or throws. The normative description is plugins/checkpoint_native/README.md;
// keep the two in step.
//
//   offset 0   char[8]  magic "MIXTRAIN"
//          8   u32      format version (1)
//         12   u32      flags (no flag is defined in version 1; readers reject unknown bits)
//         16   u64      header length in bytes (H)
//         24   u32      CRC-32 (zlib) of the H header bytes
//         28   H bytes  UTF-8 JSON header: {"metadata": {...}, "tensors": [...], "data_length": N}
//   align64(28 + H)     data section: tensor bytes, each tensor starting at a multiple of 64
//                       bytes from the data section (hence from the file) start; zero padding.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace mixtrain::checkpoint_native {

inline constexpr std::array<char, 8> kMagic = {'M', 'I', 'X', 'T', 'R', 'A', 'I', 'N'};
inline constexpr std::uint32_t kFormatVersion = 1;
// Flags a reader of this version understands; any other bit set means "written by a newer
// writer with a feature we cannot honour", which is an error rather than a silent misread.
inline constexpr std::uint32_t kKnownFlags = 0;
inline constexpr std::size_t kPreambleSize = 28;
// 64 bytes: a cache line and the widest SIMD load, so a reader may mmap and use tensors in place.
inline constexpr std::uint64_t kDataAlignment = 64;

struct Preamble {
  std::array<char, 8> magic = kMagic;
  std::uint32_t format_version = kFormatVersion;
  std::uint32_t flags = 0;
  std::uint64_t header_length = 0;
  std::uint32_t header_crc32 = 0;
};

namespace layout_detail {
template <class T>
inline void store_le(std::byte* out, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i)
    out[i] = static_cast<std::byte>((static_cast<std::uint64_t>(value) >> (8 * i)) & 0xFFu);
}
template <class T>
inline T load_le(const std::byte* in) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i)
    v |= static_cast<std::uint64_t>(std::to_integer<unsigned>(in[i])) << (8 * i);
  return static_cast<T>(v);
}
}  // namespace layout_detail

inline std::array<std::byte, kPreambleSize> encode_preamble(const Preamble& p) {
  std::array<std::byte, kPreambleSize> out{};
  std::memcpy(out.data(), p.magic.data(), p.magic.size());
  layout_detail::store_le<std::uint32_t>(out.data() + 8, p.format_version);
  layout_detail::store_le<std::uint32_t>(out.data() + 12, p.flags);
  layout_detail::store_le<std::uint64_t>(out.data() + 16, p.header_length);
  layout_detail::store_le<std::uint32_t>(out.data() + 24, p.header_crc32);
  return out;
}

// `in` must point at kPreambleSize readable bytes.
inline Preamble decode_preamble(const std::byte* in) {
  Preamble p;
  std::memcpy(p.magic.data(), in, p.magic.size());
  p.format_version = layout_detail::load_le<std::uint32_t>(in + 8);
  p.flags = layout_detail::load_le<std::uint32_t>(in + 12);
  p.header_length = layout_detail::load_le<std::uint64_t>(in + 16);
  p.header_crc32 = layout_detail::load_le<std::uint32_t>(in + 24);
  return p;
}

// Callers guarantee `n` is far from UINT64_MAX (the reader checks header_length <= file size).
constexpr std::uint64_t align_up(std::uint64_t n) {
  return (n + kDataAlignment - 1) / kDataAlignment * kDataAlignment;
}

constexpr std::uint64_t data_section_offset(std::uint64_t header_length) {
  return align_up(kPreambleSize + header_length);
}

}  // namespace mixtrain::checkpoint_native
