// CudaBackend's host_memory facet (cuda_host_memory_facet.cpp) on the device (skipped without
// one): page-locked buffers that copy_from_host and decode_images read in place, after they
// return. Batches written into two buffers in turn, each only after wait_until_read, by a loader
// thread while the compute stream lags behind, arrive intact; a buffer destroyed right after its
// upload was queued is read before it is freed; the buffers are aligned and sized as asked. The
// address lookup is host-tested (test_cuda_address_ranges); the trainer's side with a fake facet
// (test_pinned_batches).
#include <algorithm>
#include <cstdint>
#include <future>
#include <memory>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "mixtrain/sdk/backend_host_memory.h"
#include "mixtrain/sdk/backend_image_input.h"

namespace mixtrain::backend_cuda::testing {
namespace {

using sdk::HostBuffer;
using sdk::HostMemoryFacet;
using sdk::ImageInputFacet;

std::vector<std::uint8_t> pixels_of(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> pixels(n);
  for (auto& p : pixels) p = static_cast<std::uint8_t>(rng() >> 24);
  return pixels;
}

TEST_F(backend_cuda_vs_cpu, HostBuffersAreAlignedAndSizedAsAsked) {
  auto& facet = gpu<HostMemoryFacet>();
  for (std::size_t bytes :
       {std::size_t{0}, std::size_t{1}, std::size_t{4097}, std::size_t{19} << 20}) {
    auto buffer = facet.allocate_host(bytes);
    ASSERT_NE(buffer, nullptr);
    EXPECT_GE(buffer->size(), bytes);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer->data()) % 64, 0u);
    buffer->wait_until_read();  // nothing queued: returns at once
  }
}

// The trainer's pattern: the step uploads batch k from one buffer while a loader thread waits for
// the other buffer's last upload, then writes batch k + 1 into it. Identity table, so y is the
// pixels as fp32; the labels go through copy_from_host from a buffer of their own.
TEST_F(backend_cuda_vs_cpu, BatchesWrittenAfterTheirBuffersWereReadArriveIntact) {
  auto& memory = gpu<HostMemoryFacet>();
  auto& images = gpu<ImageInputFacet>();
  const std::int64_t rows = 16, channels = 3, plane = 4096;
  const auto n = static_cast<std::size_t>(rows * channels * plane);
  std::vector<float> identity(static_cast<std::size_t>(channels * 256));
  for (std::size_t i = 0; i < identity.size(); ++i) identity[i] = static_cast<float>(i % 256);
  Tensor table(gpu(), DType::fp32, {channels, 256}, identity);
  std::unique_ptr<HostBuffer> pixels[2] = {memory.allocate_host(n), memory.allocate_host(n)};
  std::unique_ptr<HostBuffer> labels[2] = {memory.allocate_host(rows * 4),
                                           memory.allocate_host(rows * 4)};
  const std::int64_t busy_n = std::int64_t{1} << 25;
  Tensor busy_a(gpu(), DType::fp32, {busy_n}), busy_b(gpu(), DType::bf16, {busy_n});
  constexpr int kBatches = 6;
  // Every batch's bytes made first, so a write follows its wait at once: a wait that returned
  // early would let it overwrite bytes a queued upload has yet to read.
  std::vector<std::vector<std::uint8_t>> batches;
  for (int k = 0; k < kBatches; ++k)
    batches.push_back(pixels_of(n, 10 + static_cast<std::uint32_t>(k)));
  const auto write = [&](int k) {
    auto& p = *pixels[k % 2];
    auto& l = *labels[k % 2];
    p.wait_until_read();
    l.wait_until_read();
    const auto& values = batches[static_cast<std::size_t>(k)];
    std::copy(values.begin(), values.end(), reinterpret_cast<std::uint8_t*>(p.data()));
    auto* y = reinterpret_cast<std::int32_t*>(l.data());
    for (std::int64_t r = 0; r < rows; ++r) y[r] = static_cast<std::int32_t>(k * 100 + r);
  };
  std::vector<std::unique_ptr<Tensor>> ys, ls;
  write(0);
  for (int k = 0; k < kBatches; ++k) {
    // The loader writes the next batch into the other buffers while this one is sent.
    auto loader = std::async(std::launch::async, [&, k] {
      if (k + 1 < kBatches) write(k + 1);
    });
    // The compute stream lags by milliseconds (about 0.07 ms a cast on an H200), far behind the
    // host's writes.
    for (int i = 0; i < 100; ++i) gpu().cast(busy_a, busy_b);
    ys.push_back(std::make_unique<Tensor>(gpu(), DType::fp32, Shape{rows, channels * plane}));
    ls.push_back(std::make_unique<Tensor>(gpu(), DType::int32, Shape{rows}));
    images.decode_images(
        {reinterpret_cast<const std::uint8_t*>(pixels[k % 2]->data()), rows, channels, plane},
        table, *ys.back());
    gpu().copy_from_host(*ls.back(), labels[k % 2]->data());
    loader.get();
  }
  for (int k = 0; k < kBatches; ++k) {
    const auto& values = batches[static_cast<std::size_t>(k)];
    const std::vector<float> want(values.begin(), values.end());
    EXPECT_EQ(ys[static_cast<std::size_t>(k)]->get(), want) << "batch " << k;
    std::vector<float> want_labels;
    for (std::int64_t r = 0; r < rows; ++r) want_labels.push_back(static_cast<float>(k * 100 + r));
    EXPECT_EQ(ls[static_cast<std::size_t>(k)]->get(), want_labels) << "batch " << k;
  }
}

// The destructor waits for the queued read: the upload never reads freed memory.
TEST_F(backend_cuda_vs_cpu, AHostBufferDestroyedWhileItsUploadIsQueuedIsReadFirst) {
  auto& memory = gpu<HostMemoryFacet>();
  const std::int64_t n = std::int64_t{1} << 22;
  const std::int64_t busy_n = std::int64_t{1} << 25;
  Tensor busy_a(gpu(), DType::fp32, {busy_n}), busy_b(gpu(), DType::bf16, {busy_n});
  Tensor x(gpu(), DType::fp32, {n});
  std::vector<float> want(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<float>(i % 1000) - 500.0f;
  {
    auto buffer = memory.allocate_host(static_cast<std::size_t>(n) * 4);
    std::copy(want.begin(), want.end(), reinterpret_cast<float*>(buffer->data()));
    for (int i = 0; i < 100; ++i) gpu().cast(busy_a, busy_b);
    gpu().copy_from_host(x, buffer->data());
  }
  EXPECT_EQ(x.get(), want);
}

}  // namespace
}  // namespace mixtrain::backend_cuda::testing
