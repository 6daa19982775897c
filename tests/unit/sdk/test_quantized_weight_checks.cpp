// The quantized weight facet's argument checks (BackendArgumentChecks::dequantize_nf4 and
// dequantize_block_scaled), shared by the CPU and CUDA backends: the views' data is never read.
// Good arguments return the element count or the block grid; every bad one raises BackendError
// "backend_test.<op>: ..." naming it.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "backend_error_text.h"
#include "fake_device_memory.h"
#include "mixtrain/sdk/backend_quantized_weight.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/backend_argument_checks.h"
#include "mixtrain/sdk/support/block_scaling.h"

namespace {

using mixtrain::test::backend_error_of;
using mixtrain::test::message_mismatch;

namespace sdk = mixtrain::sdk;
using sdk::DType;
using sdk::Shape;
using sdk::TensorView;

// Fake device addresses (never dereferenced).
void* at(std::size_t offset) {
  return mixtrain::test::fake_device_address(offset);
}

const sdk::BackendArgumentChecks kChecks("backend_test");

void expect_error(const std::string& message, const char* op,
                  std::initializer_list<const char*> parts) {
  EXPECT_EQ(message_mismatch(message, std::string("backend_test.") + op + ": ", parts), "");
}

TEST(QuantizedWeightChecks, Nf4TakesOneAbsmaxABlockAndAnyStorageOut) {
  // 100 elements in blocks of 64: 2 absmax, the last block partial.
  for (DType t : {DType::fp32, DType::bf16, DType::fp16})
    EXPECT_EQ(kChecks.dequantize_nf4(at(0), {at(4096), DType::fp32, Shape{2}}, 64,
                                     {at(8192), t, Shape{10, 10}}),
              100);
  const auto nf4 = [](const void* codes, TensorView absmax, std::int64_t block, TensorView out) {
    return backend_error_of([&] { kChecks.dequantize_nf4(codes, absmax, block, out); });
  };
  const TensorView absmax{at(4096), DType::fp32, Shape{2}};
  const TensorView out{at(8192), DType::bf16, Shape{10, 10}};
  expect_error(nf4(nullptr, absmax, 64, out), "dequantize_nf4", {"codes is a null pointer"});
  expect_error(nf4(at(0), absmax, 0, out), "dequantize_nf4", {"block size 0 < 1"});
  expect_error(nf4(at(0), {at(4096), DType::fp32, Shape{1}}, 64, out), "dequantize_nf4",
               {"absmax"});
  expect_error(nf4(at(0), {at(4096), DType::bf16, Shape{2}}, 64, out), "dequantize_nf4",
               {"absmax"});
  expect_error(nf4(at(0), absmax, 64, {at(8192), DType::fp8_e4m3, Shape{10, 10}}), "dequantize_nf4",
               {"out"});
}

TEST(QuantizedWeightChecks, BlockScaledNeedsItsLayoutsCodesScalesAndTensorScale) {
  // MX along the columns, E4M3 codes: [64, 64] is 4096 code bytes and 64 x 2 E8M0 scale bytes.
  const auto mx = sdk::mx_layout(sdk::ReductionAxis::cols, sdk::BlockElement::e4m3);
  const TensorView codes{at(0), DType::fp8_e4m3, Shape{64 * 64}};
  const TensorView scales{at(8192), DType::fp8_e4m3, Shape{64 * 2}};
  const TensorView out{at(16384), DType::bf16, Shape{64, 64}};
  const auto grid = kChecks.dequantize_block_scaled({codes, scales, {}, mx}, out);
  EXPECT_EQ(grid.rows, 64);
  EXPECT_EQ(grid.cols, 2);
  const auto refused = [](const sdk::BlockScaledWeight& w, const TensorView& o) {
    return backend_error_of([&] { kChecks.dequantize_block_scaled(w, o); });
  };
  const char* op = "dequantize_block_scaled";
  expect_error(refused({{at(0), DType::fp8_e4m3, Shape{64 * 63}}, scales, {}, mx}, out), op,
               {"codes must be 4096 bytes"});
  expect_error(refused({{at(0), DType::bf16, Shape{64 * 64}}, scales, {}, mx}, out), op,
               {"codes must be 4096 bytes"});
  expect_error(refused({codes, {at(8192), DType::fp8_e4m3, Shape{64}}, {}, mx}, out), op,
               {"scales must be 128 1-byte scale codes"});
  expect_error(refused({codes, scales, {}, mx}, {at(16384), DType::bf16, Shape{64 * 64}}), op,
               {"[rows, cols]"});
  expect_error(refused({codes, scales, {}, mx}, {at(16384), DType::int32, Shape{64, 64}}), op,
               {"out"});
  // fp8-block's fp32 scales: one a 128 x 128 block.
  const auto fp8_block = sdk::fp8_block_weight_layout();
  EXPECT_EQ(
      kChecks
          .dequantize_block_scaled({codes, {at(8192), DType::fp32, Shape{1}}, {}, fp8_block}, out)
          .cols,
      1);
  expect_error(refused({codes, {at(8192), DType::fp8_e4m3, Shape{1}}, {}, fp8_block}, out), op,
               {"scales must be 1 fp32 values"});
  // NVFP4: packed E2M1 codes (two a byte) and its tensor scale, fp32 [1].
  const auto nvfp4 = sdk::nvfp4_weight_layout();
  const TensorView packed{at(0), DType::fp8_e4m3, Shape{64 * 64 / 2}};
  const TensorView block_scales{at(8192), DType::fp8_e4m3, Shape{4 * 4}};
  EXPECT_EQ(kChecks
                .dequantize_block_scaled(
                    {packed, block_scales, {at(12288), DType::fp32, Shape{1}}, nvfp4}, out)
                .rows,
            4);
  expect_error(refused({packed, block_scales, {}, nvfp4}, out), op, {"tensor_scale"});
  expect_error(refused({packed, block_scales, {at(12288), DType::fp32, Shape{2}}, nvfp4}, out), op,
               {"tensor_scale"});
}

}  // namespace
