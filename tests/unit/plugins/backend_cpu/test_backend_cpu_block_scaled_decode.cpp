// The block-scaled weight decode (cpu_block_scaled_decode.h) on every ISA variant and thread
// count: each element the SDK reference's value rounded once into fp32, bf16 and fp16, bit for
// bit, for every weight layout a frozen base may be stored in (FP8 blocks of 128 × 128, MX blocks
// of 32 along either dimension, E2M1 packed two to a byte with NVFP4's tensor scale), on a shape
// large enough to run in parallel and one whose blocks and rows end part-way.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend_test_util.h"
#include "cpu_block_scaled.h"
#include "cpu_block_scaled_decode.h"
#include "isa_variants.h"
#include "mixtrain/conformance/weight_layouts.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::backend_cpu::testing {
namespace {

// The reference's fp32 values in `dtype`'s bits (fp32: the values' own), one rounding.
std::vector<std::uint32_t> reference_bits(const std::vector<float>& values, DType dtype) {
  std::vector<std::uint32_t> bits(values.size());
  if (dtype == DType::fp32) {
    std::memcpy(bits.data(), values.data(), values.size() * 4);
    return bits;
  }
  std::vector<std::uint16_t> narrow(values.size());
  sdk::convert(std::span<const float>(values), std::span<std::uint16_t>(narrow), dtype,
               sdk::EncodeOptions{});
  for (std::size_t i = 0; i < narrow.size(); ++i) bits[i] = narrow[i];
  return bits;
}

std::vector<std::uint32_t> output_bits(const std::vector<std::uint8_t>& raw, DType dtype) {
  std::vector<std::uint32_t> bits(raw.size() / sdk::dtype_size(dtype));
  for (std::size_t i = 0; i < bits.size(); ++i) {
    if (dtype == DType::fp32) {
      std::memcpy(&bits[i], raw.data() + 4 * i, 4);
    } else {
      std::uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      bits[i] = h;
    }
  }
  return bits;
}

TEST(backend_cpu_block_scaled_decode, EveryIsaAndThreadCountGivesTheReferenceRoundedOnce) {
  const std::vector<sdk::BlockScaledLayout> layouts = conformance::block_scaled_weight_layouts();
  for (const auto& layout : layouts)
    for (const Shape shape : {Shape{300, 130}, Shape{7, 37}}) {
      const std::int64_t rows = shape[0], cols = shape[1];
      std::vector<float> x = random_values(static_cast<std::size_t>(rows * cols), 77, -3.0f, 3.0f);
      x[40] = 900.0f;  // an outlier: the other elements of its block round to small codes
      sdk::BlockScaledTensor q = sdk::quantize_block_scaled(x, rows, cols, layout);
      // A tensor scale one ulp above 1: its products with the block scales need more than fp32's
      // 24 bits, so a decode that rounded scale · tensor scale first would round twice.
      if (layout.tensor_scale) q.tensor_scale = std::nextafter(1.0f, 2.0f);
      const std::vector<float> want = sdk::dequantize_block_scaled(q);
      const sdk::BlockExtent grid = sdk::block_grid(layout, rows, cols);
      std::vector<float> scale_values;
      for (std::int64_t br = 0; br < grid.rows; ++br)
        for (std::int64_t bc = 0; bc < grid.cols; ++bc)
          scale_values.push_back(sdk::block_scale_value(q, br, bc));
      // The scales as fp32 values, and byte-coded ones also as their codes (the facet's form).
      std::vector<std::pair<std::string, BlockScales>> forms = {
          {"fp32 scales", BlockScales{.grid_cols = grid.cols, .values = scale_values.data()}}};
      std::array<float, 256> code_values{};
      if (!q.scale_codes.empty()) {
        code_values = scale_code_values(layout.scale);
        forms.emplace_back("scale codes", BlockScales{.grid_cols = grid.cols,
                                                      .codes = q.scale_codes.data(),
                                                      .code_values = &code_values});
      }
      const bool packed = layout.element == sdk::BlockElement::e2m1;
      const std::vector<std::uint8_t> codes = packed ? sdk::pack_e2m1(q.codes) : q.codes;
      for (const DType dtype : {DType::fp32, DType::bf16, DType::fp16}) {
        const std::vector<std::uint32_t> expected = reference_bits(want, dtype);
        for (const auto& [form, scales] : forms)
          for (const auto& [threads, isa] : thread_and_isa_runs()) {
            const IsaScope scope(isa);
            CpuBackend be(threads);  // the OpenMP team the decode runs on
            std::vector<std::uint8_t> raw(want.size() * sdk::dtype_size(dtype), 0xee);
            decode_block_scaled(codes.data(), packed, block_element_values(layout.element), scales,
                                layout.block_rows, layout.block_cols, q.tensor_scale,
                                {raw.data(), dtype, shape});
            EXPECT_EQ(output_bits(raw, dtype), expected)
                << sdk::describe(layout) << " " << shape.to_string() << " "
                << sdk::dtype_name(dtype) << ", " << form << ", " << isa_name(isa) << ", "
                << threads << " thread(s)";
          }
      }
    }
}

// Every scale code, the special ones included, in MX-shaped blocks of every element code: E8M0's
// extremes (2^-127, 2^127) take elements into bf16's and fp16's subnormals, to zero and to
// infinity, and its NaN code (0xFF) makes a block NaN; E4M3 scales are not powers of two, so the
// products round. Each element is its definition: value · scale in fp32, rounded once, then into
// out's dtype.
TEST(backend_cpu_block_scaled_decode, EveryScaleCodeDecodesItsBlocks) {
  const std::int64_t rows = 64, cols = 320, block_cols = 32, grid_cols = cols / block_cols;
  const std::array<float, 256>& values = block_element_values(sdk::BlockElement::e4m3);
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint8_t>(i * 37 % 256);
  std::vector<std::uint8_t> scale_codes(static_cast<std::size_t>(rows * grid_cols));
  for (std::size_t b = 0; b < scale_codes.size(); ++b)
    scale_codes[b] = static_cast<std::uint8_t>(b * 101 % 256);  // all 256, scattered
  for (const sdk::BlockScale scale : {sdk::BlockScale::e8m0, sdk::BlockScale::e4m3}) {
    const std::array<float, 256> scale_values = scale_code_values(scale);
    std::vector<float> want(codes.size());
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c)
        want[static_cast<std::size_t>(r * cols + c)] =
            values[codes[static_cast<std::size_t>(r * cols + c)]] *
            scale_values[scale_codes[static_cast<std::size_t>(r * grid_cols + c / block_cols)]];
    const BlockScales scales{
        .grid_cols = grid_cols, .codes = scale_codes.data(), .code_values = &scale_values};
    for (const DType dtype : {DType::fp32, DType::bf16, DType::fp16})
      for (const auto& [threads, isa] : thread_and_isa_runs()) {
        const IsaScope scope(isa);
        CpuBackend be(threads);
        std::vector<std::uint8_t> raw(want.size() * sdk::dtype_size(dtype), 0xee);
        decode_block_scaled(codes.data(), false, values, scales, 1, block_cols, 1.0f,
                            {raw.data(), dtype, Shape{rows, cols}});
        EXPECT_EQ(output_bits(raw, dtype), reference_bits(want, dtype))
            << (scale == sdk::BlockScale::e8m0 ? "e8m0" : "e4m3") << " scales, "
            << sdk::dtype_name(dtype) << ", " << isa_name(isa) << ", " << threads << " thread(s)";
      }
  }
}

// The lookups take half a table where the upper half of the codes is the lower half negated (an
// FP8 format's sign bit) and the whole table otherwise. Element values without that symmetry (all
// positive, each code its own value) take the whole-table lookups, in blocks of 128 x 128 (a table
// per block), of 32 along the rows with byte-coded power-of-two scales (one table, its exponents
// shifted per block) and with byte-coded scales that are not powers of two (a table per code).
TEST(backend_cpu_block_scaled_decode, ElementValuesWithoutASignBitTakeTheWholeTable) {
  std::array<float, 256> values{};
  for (int code = 0; code < 256; ++code) values[static_cast<std::size_t>(code)] = 0.25f * code;
  const std::int64_t rows = 256, cols = 256;
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint8_t>(i * 37 % 256);
  struct Case {
    const char* name;
    std::int64_t block_rows, block_cols;
    sdk::BlockScale coded;  // fp32 for fp32 values
  };
  for (const Case& c : {Case{"128x128 fp32", 128, 128, sdk::BlockScale::fp32},
                        Case{"1x32 e8m0", 1, 32, sdk::BlockScale::e8m0},
                        Case{"1x32 e4m3", 1, 32, sdk::BlockScale::e4m3}}) {
    const std::int64_t grid_rows = rows / c.block_rows, grid_cols = cols / c.block_cols;
    std::vector<std::uint8_t> scale_codes(static_cast<std::size_t>(grid_rows * grid_cols));
    for (std::size_t b = 0; b < scale_codes.size(); ++b)  // scales of about 2^-4 .. 2^4
      scale_codes[b] = static_cast<std::uint8_t>((c.coded == sdk::BlockScale::e8m0 ? 123 : 40) +
                                                 static_cast<int>(b * 7 % 9));
    std::array<float, 256> code_values{};
    std::vector<float> scale_values(scale_codes.size());
    if (c.coded != sdk::BlockScale::fp32) {
      code_values = scale_code_values(c.coded);
      for (std::size_t b = 0; b < scale_codes.size(); ++b)
        scale_values[b] = code_values[scale_codes[b]];
    } else {
      for (std::size_t b = 0; b < scale_codes.size(); ++b)
        scale_values[b] = std::ldexp(1.0f, static_cast<int>(b % 9) - 4);
    }
    std::vector<float> want(codes.size());
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t col = 0; col < cols; ++col) {
        const std::size_t i = static_cast<std::size_t>(r * cols + col);
        want[i] = values[codes[i]] * scale_values[static_cast<std::size_t>(
                                         (r / c.block_rows) * grid_cols + col / c.block_cols)];
      }
    const BlockScales scales =
        c.coded == sdk::BlockScale::fp32
            ? BlockScales{.grid_cols = grid_cols, .values = scale_values.data()}
            : BlockScales{
                  .grid_cols = grid_cols, .codes = scale_codes.data(), .code_values = &code_values};
    for (const DType dtype : {DType::bf16, DType::fp16})
      for (const auto& [threads, isa] : thread_and_isa_runs()) {
        const IsaScope scope(isa);
        CpuBackend be(threads);
        std::vector<std::uint8_t> raw(want.size() * sdk::dtype_size(dtype), 0xee);
        decode_block_scaled(codes.data(), false, values, scales, c.block_rows, c.block_cols, 1.0f,
                            {raw.data(), dtype, Shape{rows, cols}});
        EXPECT_EQ(output_bits(raw, dtype), reference_bits(want, dtype))
            << c.name << ", " << sdk::dtype_name(dtype) << ", " << isa_name(isa) << ", " << threads
            << " thread(s)";
      }
  }
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
