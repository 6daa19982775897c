// Reading little-endian integers out of a byte string, for tests that take file formats apart
// (TFRecord frames, safetensors headers) without the code under test.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mixtrain::test {

// The `bytes`-byte little-endian unsigned integer at `at` of `s` (the caller checks the bounds).
inline std::uint64_t read_le(const std::string& s, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[at + static_cast<std::size_t>(i)]))
         << (8 * i);
  return v;
}

}  // namespace mixtrain::test
