// The host batches' memory (train/host_batch.h): arrays live in the backend's host_memory buffers
// where it offers them, growth replaces a buffer (whose destructor waits for its uploads), a batch
// about to be written waits for every buffer of it, and a backend that refuses is asked once,
// logged once, and leaves ordinary memory that works the same.
#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "mixtrain/sdk/error.h"
#include "plugin_test_support.h"
#include "train/host_batch.h"

namespace mixtrain::core {
namespace {

// What happened to each buffer the fake facet handed out, in order of allocation.
struct BufferLog {
  std::size_t bytes = 0;
  int waits = 0;
  bool destroyed = false;
};

class FakeBuffer final : public sdk::HostBuffer {
 public:
  FakeBuffer(std::size_t bytes, BufferLog& log)
      : memory_(new (std::align_val_t{64}) std::byte[bytes]), bytes_(bytes), log_(log) {}
  ~FakeBuffer() override {
    log_.destroyed = true;
    ::operator delete[](memory_, std::align_val_t{64});
  }
  std::byte* data() noexcept override { return memory_; }
  std::size_t size() const noexcept override { return bytes_; }
  void wait_until_read() override { ++log_.waits; }

 private:
  std::byte* memory_;
  std::size_t bytes_;
  BufferLog& log_;
};

class FakeHostMemory final : public sdk::HostMemoryFacet {
 public:
  std::unique_ptr<sdk::HostBuffer> allocate_host(std::size_t bytes) override {
    ++asked;
    if (refuse)
      throw sdk::BackendError("cudaHostAlloc of " + std::to_string(bytes) + " bytes failed");
    logs.push_back(std::make_unique<BufferLog>());
    logs.back()->bytes = bytes;
    return std::make_unique<FakeBuffer>(bytes, *logs.back());
  }
  std::vector<std::unique_ptr<BufferLog>> logs;
  int asked = 0;
  bool refuse = false;
};

TEST(HostBatch, ArraysLiveInTheBackendsBuffersAndGrowIntoNewOnes) {
  FakeHostMemory facet;
  test::CapturingSink sink;
  const HostMemory memory(&facet, sdk::Logger(&sink, "trainer"));
  EXPECT_TRUE(memory.pinned());
  HostArray<float> x(&memory);
  x.resize(100);
  ASSERT_EQ(facet.logs.size(), 1u);
  EXPECT_EQ(facet.logs[0]->bytes, 400u);
  float* first = x.data();
  first[99] = 2.5f;  // the whole buffer is writable
  x.resize(60);      // within the buffer: no new one
  EXPECT_EQ(x.size(), 60u);
  EXPECT_EQ(x.data(), first);
  EXPECT_EQ(facet.logs.size(), 1u);
  x.resize(101);  // past it: a new buffer; the old one freed (its destructor waits for its reads)
  ASSERT_EQ(facet.logs.size(), 2u);
  EXPECT_EQ(facet.logs[1]->bytes, 404u);
  EXPECT_TRUE(facet.logs[0]->destroyed);
  EXPECT_EQ(x.size(), 101u);
  EXPECT_FALSE(facet.logs[1]->destroyed);
  EXPECT_TRUE(sink.lines.empty());
}

TEST(HostBatch, PreparingToWriteWaitsForEveryBufferOfTheBatch) {
  FakeHostMemory facet;
  test::CapturingSink sink;
  const HostMemory memory(&facet, sdk::Logger(&sink, "trainer"));
  HostBatch batch(&memory);
  batch.pixels.resize(48);
  batch.y.resize(4);
  ASSERT_EQ(facet.logs.size(), 2u);
  batch.prepare_to_write();
  batch.prepare_to_write();
  EXPECT_EQ(facet.logs[0]->waits, 2);
  EXPECT_EQ(facet.logs[1]->waits, 2);
  // Moved (as the loader thread's spare is swapped), the buffers go along, not copied.
  HostBatch other(std::move(batch));
  EXPECT_EQ(facet.logs.size(), 2u);
  EXPECT_EQ(other.pixels.size(), 48u);
}

TEST(HostBatch, ARefusalIsAskedOnceAndLoggedOnceAndOrdinaryMemoryServes) {
  FakeHostMemory facet;
  facet.refuse = true;
  test::CapturingSink sink;
  const HostMemory memory(&facet, sdk::Logger(&sink, "trainer"));
  HostArray<std::int32_t> ids(&memory), y(&memory);
  ids.resize(1000);
  y.resize(8);
  EXPECT_EQ(facet.asked, 1) << "a refusal is final: the next array does not ask again";
  EXPECT_FALSE(memory.pinned());
  ASSERT_EQ(sink.lines.size(), 1u);
  EXPECT_EQ(sink.lines[0].level, sdk::LogLevel::warn);
  EXPECT_NE(sink.lines[0].message.find("data.pin_memory"), std::string::npos);
  EXPECT_NE(sink.lines[0].message.find("4000 bytes failed"), std::string::npos);
  ids.data()[999] = 7;  // ordinary memory, all of it
  EXPECT_EQ(ids.size(), 1000u);
  ids.wait_until_read();  // nothing to wait for
}

TEST(HostBatch, WithoutTheFacetArraysAreOrdinaryMemory) {
  test::CapturingSink sink;
  const HostMemory memory(nullptr, sdk::Logger(&sink, "trainer"));
  EXPECT_FALSE(memory.pinned());
  HostBatch batch(&memory);
  batch.x.resize(5);
  batch.x.data()[4] = 1.0f;
  batch.prepare_to_write();
  HostBatch plain;
  plain.y.resize(3);
  EXPECT_NE(plain.y.data(), nullptr);
  EXPECT_TRUE(sink.lines.empty());
}

}  // namespace
}  // namespace mixtrain::core
