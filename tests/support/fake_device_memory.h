// Fake device addresses for tests of the backends' argument checks, which look at views' dtypes,
// shapes and addresses (overlap, alignment) but never read their data: one 1 MiB host region, so
// distinct offsets are distinct, non-null, ordered addresses.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <vector>

namespace mixtrain::test {

inline constexpr std::size_t kFakeDeviceBytes = std::size_t{1} << 20;

// The address `offset` bytes into the region; an offset past it is the test's own mistake.
inline void* fake_device_address(std::size_t offset) {
  static std::vector<unsigned char> memory(kFakeDeviceBytes);
  if (offset >= memory.size()) throw std::out_of_range("fake_device_address: offset past 1 MiB");
  return memory.data() + offset;
}

}  // namespace mixtrain::test
