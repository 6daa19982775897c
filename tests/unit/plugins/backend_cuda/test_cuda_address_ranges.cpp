// The host_memory facet's registry (cuda_address_ranges.h), plain C++: an upload's source is found
// only when it lies wholly inside one registered buffer, at its start, middle or end; ranges that
// start before a buffer, run past its end, fall between buffers or are empty find nothing; a
// removed buffer is gone; and a thread adding and removing buffers beside lookups is safe.
#include <gtest/gtest.h>

#include <cstddef>
#include <thread>
#include <vector>

#include "cuda_address_ranges.h"

namespace mixtrain::backend_cuda {
namespace {

struct Block {
  int id = 0;
};

TEST(CudaAddressRanges, ASourceIsFoundOnlyWhollyInsideOneBuffer) {
  std::vector<std::byte> memory(1000);
  std::byte* base = memory.data();
  Block a{1}, b{2};
  AddressRanges<Block> ranges;
  ranges.add(base + 100, 100, &a);  // [100, 200)
  ranges.add(base + 300, 50, &b);   // [300, 350)
  EXPECT_EQ(ranges.find(base + 100, 100), &a);
  EXPECT_EQ(ranges.find(base + 150, 50), &a);
  EXPECT_EQ(ranges.find(base + 199, 1), &a);
  EXPECT_EQ(ranges.find(base + 300, 1), &b);
  EXPECT_EQ(ranges.find(base + 310, 40), &b);
  EXPECT_EQ(ranges.find(base + 99, 2), nullptr) << "starts before the buffer";
  EXPECT_EQ(ranges.find(base + 150, 51), nullptr) << "runs past its end";
  EXPECT_EQ(ranges.find(base + 200, 1), nullptr) << "one past the end";
  EXPECT_EQ(ranges.find(base + 250, 10), nullptr) << "between buffers";
  EXPECT_EQ(ranges.find(base + 190, 120), nullptr) << "spans two buffers and the gap";
  EXPECT_EQ(ranges.find(base, 10), nullptr) << "before every buffer";
  EXPECT_EQ(ranges.find(base + 120, 0), nullptr) << "nothing to read";
  ranges.remove(base + 100);
  EXPECT_EQ(ranges.find(base + 150, 10), nullptr);
  EXPECT_EQ(ranges.find(base + 300, 10), &b);
  ranges.remove(base + 500);  // unknown: ignored
  EXPECT_EQ(ranges.size(), 1u);
}

TEST(CudaAddressRanges, BuffersComeAndGoOnAnotherThreadWhileUploadsLookUp) {
  std::vector<std::byte> memory(64 * 64);
  std::vector<Block> blocks(64);
  AddressRanges<Block> ranges;
  Block fixed{99};
  ranges.add(memory.data(), 64, &fixed);
  std::thread loader([&] {
    for (int round = 0; round < 200; ++round)
      for (std::size_t i = 1; i < blocks.size(); ++i) {
        ranges.add(memory.data() + 64 * i, 64, &blocks[i]);
        ranges.remove(memory.data() + 64 * i);
      }
  });
  int found = 0;
  for (int i = 0; i < 20000; ++i) found += ranges.find(memory.data() + 8, 16) == &fixed;
  loader.join();
  EXPECT_EQ(found, 20000);
  EXPECT_EQ(ranges.size(), 1u);
}

}  // namespace
}  // namespace mixtrain::backend_cuda
