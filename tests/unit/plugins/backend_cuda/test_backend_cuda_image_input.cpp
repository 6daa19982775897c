// CudaBackend's image_input facet (cuda_image_input_facet.cpp) on the device (skipped without
// one): decode_images against a host reference bit for bit for every output dtype and for planes
// that are and are not a multiple of 4; the host buffer free on return and each batch its own
// device slot while the compute stream lags behind the copies; the slots counted in the memory
// statistics; bad arguments and a step-graph recording refused before anything is enqueued. The
// argument rule itself is host-tested (test_sdk, DecodeImagesChecks).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend_error_text.h"
#include "cuda_test_util.h"
#include "mixtrain/sdk/backend_image_input.h"
#include "mixtrain/sdk/backend_scratch.h"
#include "mixtrain/sdk/backend_step_graph.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cuda::testing {
namespace {

using sdk::ByteImages;
using sdk::ImageInputFacet;

const DType kOutputs[] = {DType::fp32, DType::bf16, DType::fp16};

// Random rows, every one also holding the values that decide a rounding: ties of bf16 (1 + 2^-8
// rounds down to even, 1 + 3·2^-8 up) and of fp16 (1 + 2^-11), fp16 overflow (65520 -> inf, 65519
// -> 65504), subnormals of fp16 and of fp32, signed zeros, infinities, NaNs with payloads.
std::vector<float> decode_table(std::int64_t channels, std::uint32_t seed) {
  std::vector<float> table = random_values(static_cast<std::size_t>(channels * 256), seed, -3, 3);
  const float specials[] = {1.0f + 0x1p-8f,
                            1.0f + 3 * 0x1p-8f,
                            1.0f + 0x1p-11f,
                            -(1.0f + 3 * 0x1p-11f),
                            65520.0f,
                            65519.0f,
                            -70000.0f,
                            3e-5f,
                            6e-8f,
                            1e-40f,
                            -1e-45f,
                            0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::bit_cast<float>(0x7FC00001u),
                            std::bit_cast<float>(0xFFA12345u),
                            3.4e38f};
  for (std::int64_t c = 0; c < channels; ++c)
    for (std::size_t k = 0; k < std::size(specials); ++k)
      table[static_cast<std::size_t>(c * 256) + 7 * k] = specials[k];
  return table;
}

std::vector<std::uint8_t> random_pixels(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> pixels(n);
  for (auto& p : pixels) p = static_cast<std::uint8_t>(rng() >> 24);
  return pixels;
}

// y's bytes as the host computes them: each pixel's entry of its channel's row, rounded once by
// the SDK's encoders (round to nearest even; fp32 is the entry's bits).
std::vector<std::uint8_t> reference(const std::uint8_t* pixels, std::size_t n,
                                    const std::vector<float>& table, std::int64_t channels,
                                    std::int64_t plane, DType dtype) {
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<std::int64_t>(i) / plane % channels;
    values[i] = table[static_cast<std::size_t>(c * 256 + pixels[i])];
  }
  return encode(values, dtype);
}

struct Batch {
  std::int64_t rows, channels, plane;
  std::size_t pixels() const { return static_cast<std::size_t>(rows * channels * plane); }
  std::string text() const {
    return std::to_string(rows) + " x " + std::to_string(channels) + " x " + std::to_string(plane);
  }
};

TEST_F(backend_cuda_vs_cpu, ImageInputIsOfferedForFp32TablesIntoStorageFloats) {
  auto& facet = gpu<ImageInputFacet>();
  EXPECT_EQ(facet.name(), "image_input");
  for (DType y : kOutputs) {
    const DType ok[] = {DType::fp32, y};
    EXPECT_TRUE(facet.supports(ImageInputFacet::Op::decode_images, ok)) << sdk::dtype_name(y);
  }
  const DType bf16_table[] = {DType::bf16, DType::bf16};
  EXPECT_FALSE(facet.supports(ImageInputFacet::Op::decode_images, bf16_table));
  const DType int_y[] = {DType::fp32, DType::int32};
  EXPECT_FALSE(facet.supports(ImageInputFacet::Op::decode_images, int_y));
}

TEST_F(backend_cuda_vs_cpu, DecodeImagesMatchesTheHostBitForBit) {
  auto& facet = gpu<ImageInputFacet>();
  // Planes a multiple of 4 (four pixels a load) and not (one at a time), no rows, one, several,
  // and one ResNet-sized plane, which meets every byte value of every channel.
  const Batch batches[] = {{0, 3, 5},  {1, 3, 7},   {1, 1, 1},    {2, 3, 4},        {3, 3, 13},
                           {4, 3, 50}, {5, 2, 64},  {7, 4, 1003}, {3, 1, 2},        {6, 3, 6},
                           {1, 3, 9},  {9, 3, 256}, {2, 5, 3},    {2, 3, 224 * 224}};
  std::uint32_t seed = 1;
  for (DType dtype : kOutputs)
    for (const Batch& b : batches) {
      const std::string what = b.text() + " -> " + std::string(sdk::dtype_name(dtype));
      const auto table = decode_table(b.channels, ++seed);
      Tensor g_table(gpu(), DType::fp32, {b.channels, 256}, table);
      const auto pixels = random_pixels(b.pixels(), ++seed);
      Tensor y(gpu(), dtype, {b.rows, b.channels * b.plane});
      facet.decode_images({pixels.data(), b.rows, b.channels, b.plane}, g_table, y);
      EXPECT_EQ(y.raw(), reference(pixels.data(), pixels.size(), table, b.channels, b.plane, dtype))
          << what;
    }
}

// A y view one element into its buffer is not aligned for four-element stores: the kernel moves
// one pixel at a time, with the same values, and writes nothing outside the view.
TEST_F(backend_cuda_vs_cpu, DecodeImagesIntoAnUnalignedViewWritesOnlyItsElements) {
  auto& facet = gpu<ImageInputFacet>();
  const Batch b{3, 3, 64};
  const auto table = decode_table(3, 5);
  Tensor g_table(gpu(), DType::fp32, {3, 256}, table);
  const auto pixels = random_pixels(b.pixels(), 6);
  for (DType dtype : kOutputs) {
    const auto n = static_cast<std::int64_t>(b.pixels());
    Tensor buffer(gpu(), dtype, {n + 2}, std::vector<float>(static_cast<std::size_t>(n + 2), 7.0f));
    TensorView y = buffer;
    y.data = static_cast<char*>(y.data) + sdk::dtype_size(dtype);
    y.shape = Shape{b.rows, b.channels * b.plane};
    facet.decode_images({pixels.data(), b.rows, b.channels, b.plane}, g_table, y);
    const auto got = buffer.raw();
    const auto want = reference(pixels.data(), pixels.size(), table, 3, b.plane, dtype);
    const std::size_t size = sdk::dtype_size(dtype);
    const auto seven = encode({7.0f}, dtype);
    EXPECT_TRUE(std::equal(seven.begin(), seven.end(), got.begin())) << sdk::dtype_name(dtype);
    EXPECT_TRUE(
        std::equal(want.begin(), want.end(), got.begin() + static_cast<std::ptrdiff_t>(size)))
        << sdk::dtype_name(dtype);
    EXPECT_TRUE(
        std::equal(seven.begin(), seven.end(), got.end() - static_cast<std::ptrdiff_t>(size)))
        << sdk::dtype_name(dtype);
  }
}

// Batches decoded in a row through one host buffer, overwritten right after each call, while the
// compute stream is kept busy: the copies (their own stream) run ahead of the decodes, so a batch
// read from the caller's buffer after return, or copied into the slot a pending decode still
// needs, would come out as another batch's or the poison's values. The slots alternate, so each
// grows once while the other holds a pending batch (batches 2 and 5 are the largest), and they are
// counted in the memory statistics.
TEST_F(backend_cuda_vs_cpu, DecodeImagesCopiesBeforeReturningAndKeepsEachPendingBatchItsSlot) {
  auto& facet = gpu<ImageInputFacet>();
  auto& scratch = gpu<sdk::ScratchFacet>();
  const std::int64_t channels = 3, plane = 4096;
  const std::int64_t rows[] = {8, 8, 16, 2, 5, 16};
  const auto table = decode_table(channels, 11);
  Tensor g_table(gpu(), DType::fp32, {channels, 256}, table);
  std::vector<std::unique_ptr<Tensor>> ys;
  for (std::size_t k = 0; k < std::size(rows); ++k)
    ys.push_back(
        std::make_unique<Tensor>(gpu(), kOutputs[k % 3], Shape{rows[k], channels * plane}));
  // Work for the compute stream to chew on while the copies go ahead.
  const std::int64_t busy_n = std::int64_t{1} << 25;
  Tensor busy_a(gpu(), DType::fp32, {busy_n}), busy_b(gpu(), DType::bf16, {busy_n});
  gpu().synchronize();
  const auto stats_before = gpu().memory_stats();
  const std::size_t scratch_before = scratch.scratch_bytes();

  std::vector<std::uint8_t> buffer(static_cast<std::size_t>(16 * channels * plane));
  std::vector<std::vector<std::uint8_t>> want;
  for (std::size_t k = 0; k < std::size(rows); ++k) {
    for (int i = 0; i < 64; ++i) gpu().cast(busy_a, busy_b);  // milliseconds of lag
    const auto n = static_cast<std::size_t>(rows[k] * channels * plane);
    const auto pixels = random_pixels(n, 100 + static_cast<std::uint32_t>(k));
    std::copy(pixels.begin(), pixels.end(), buffer.begin());
    facet.decode_images({buffer.data(), rows[k], channels, plane}, g_table, *ys[k]);
    want.push_back(reference(pixels.data(), n, table, channels, plane, ys[k]->view().dtype));
    std::fill(buffer.begin(), buffer.end(), std::uint8_t{0xA5});  // must not reach the device
    if (k == 0) {
      // The first slot, counted as the context's other grow-only buffers are.
      const std::size_t grown = scratch.scratch_bytes() - scratch_before;
      EXPECT_GE(grown, n);
      EXPECT_EQ(gpu().memory_stats().current_bytes - stats_before.current_bytes, grown);
    }
  }
  for (std::size_t k = 0; k < ys.size(); ++k) EXPECT_EQ(ys[k]->raw(), want[k]) << "batch " << k;
  // Both slots, each grown to the largest batch it carried (16 rows).
  EXPECT_GE(scratch.scratch_bytes() - scratch_before,
            2 * static_cast<std::size_t>(16 * channels * plane));
}

TEST_F(backend_cuda_vs_cpu, DecodeImagesRejectsBadArgumentsBeforeEnqueuingAnything) {
  auto& facet = gpu<ImageInputFacet>();
  const auto table = decode_table(3, 21);
  Tensor g_table(gpu(), DType::fp32, {3, 256}, table);
  Tensor bf16_table(gpu(), DType::bf16, {3, 256});
  Tensor narrow_table(gpu(), DType::fp32, {3, 255});
  Tensor y(gpu(), DType::bf16, {2, 30});
  Tensor int_y(gpu(), DType::int32, {2, 30});
  Tensor short_y(gpu(), DType::bf16, {2, 29});
  const auto pixels = random_pixels(60, 22);
  const ByteImages good{pixels.data(), 2, 3, 10};
  auto message = [&](const ByteImages& images, const TensorView& t, const TensorView& out) {
    return mixtrain::test::backend_error_of([&] { facet.decode_images(images, t, out); });
  };
  EXPECT_NE(message(good, bf16_table, y).find("table is bf16 [3, 256]"), std::string::npos);
  EXPECT_NE(message(good, narrow_table, y).find("table is fp32 [3, 255]"), std::string::npos);
  EXPECT_NE(message(good, g_table, int_y).find("y is int32"), std::string::npos);
  EXPECT_NE(message(good, g_table, short_y).find("= 60 pixels"), std::string::npos);
  EXPECT_NE(message({nullptr, 2, 3, 10}, g_table, y).find("pixels is null"), std::string::npos);
  EXPECT_NE(message({pixels.data(), 2, 3, -10}, g_table, y).find("negative"), std::string::npos);
  // Nothing was left half done: the next good call decodes.
  facet.decode_images(good, g_table, y);
  EXPECT_EQ(y.raw(), reference(pixels.data(), pixels.size(), table, 3, 10, DType::bf16));
}

// A host upload cannot be recorded (a replay would read a staging slot the host has reused since):
// while a step graph records, decode_images raises as copy_from_host does; an empty batch
// enqueues nothing and passes.
TEST_F(backend_cuda_vs_cpu, DecodeImagesRefusesToBeRecordedIntoAStepGraph) {
  auto& facet = gpu<ImageInputFacet>();
  auto& graphs = gpu<sdk::StepGraphFacet>();
  const auto table = decode_table(3, 31);
  Tensor g_table(gpu(), DType::fp32, {3, 256}, table);
  Tensor y(gpu(), DType::fp16, {2, 24});
  Tensor empty_y(gpu(), DType::fp16, {0, 24});
  const auto pixels = random_pixels(48, 32);
  ASSERT_TRUE(graphs.begin_capture());
  try {
    facet.decode_images({pixels.data(), 2, 3, 8}, g_table, y);
    ADD_FAILURE() << "decode_images was recorded";
  } catch (const sdk::BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("recorded step graph"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(facet.decode_images({nullptr, 0, 3, 8}, g_table, empty_y));
  const int graph = graphs.end_capture();
  if (graph >= 0) graphs.release(graph);
  facet.decode_images({pixels.data(), 2, 3, 8}, g_table, y);
  EXPECT_EQ(y.raw(), reference(pixels.data(), pixels.size(), table, 3, 8, DType::fp16));
}

}  // namespace
}  // namespace mixtrain::backend_cuda::testing
