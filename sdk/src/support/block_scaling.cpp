// The host reference of block_scaling.h: one block at a time, each rule written as its definition
// says. Element and power-of-two rules are float_format_rules.h's (integer arithmetic, the ones
// kernels share); the fp32 scale arithmetic is plain IEEE fp32, one operation per step, and this
// file builds with -ffp-contract=off so no step is fused into another.
#include "mixtrain/sdk/support/block_scaling.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "mixtrain/sdk/support/float_format_rules.h"

namespace mixtrain::sdk {
namespace {

namespace fr = format_rules;
using u32 = std::uint32_t;

const char* element_name(BlockElement e) {
  switch (e) {
    case BlockElement::e4m3:
      return "e4m3";
    case BlockElement::e5m2:
      return "e5m2";
    case BlockElement::e2m1:
      return "e2m1";
  }
  return "?";
}

const char* scale_name(BlockScale s) {
  switch (s) {
    case BlockScale::fp32:
      return "fp32";
    case BlockScale::fp32_pow2:
      return "fp32_pow2";
    case BlockScale::e8m0:
      return "e8m0";
    case BlockScale::e8m0_round_up:
      return "e8m0_round_up";
    case BlockScale::e4m3:
      return "e4m3";
  }
  return "?";
}

bool known_element(BlockElement e) {
  return e == BlockElement::e4m3 || e == BlockElement::e5m2 || e == BlockElement::e2m1;
}

bool fp32_scales(BlockScale s) {
  return s == BlockScale::fp32 || s == BlockScale::fp32_pow2;
}

[[noreturn]] void fail(const BlockScaledLayout& layout, const std::string& why) {
  throw std::invalid_argument("block-scaled layout " + describe(layout) + ": " + why);
}

std::int64_t checked_count(const BlockScaledLayout& layout, std::int64_t rows, std::int64_t cols) {
  if (rows < 0 || cols < 0)
    fail(layout, "a tensor of " + std::to_string(rows) + " x " + std::to_string(cols) +
                     " elements: sizes must be >= 0");
  if (cols != 0 && rows > std::numeric_limits<std::int64_t>::max() / cols)
    fail(layout, "a tensor of " + std::to_string(rows) + " x " + std::to_string(cols) +
                     " elements overflows a 64-bit count");
  return rows * cols;
}

// Everything that differs between the element formats, resolved once per tensor.
struct ElementRules {
  float max;  // largest finite value
  u32 (*encode_scaled)(float, int, bool);
  u32 (*encode_scaled_stochastic)(float, int, bool, u32);
  float (*decode)(u32);
};

template <class F>
ElementRules rules_of() {
  return {fr::decode<F>(F::kMax), &fr::encode_scaled<F>, &fr::encode_scaled_stochastic<F>,
          &fr::decode<F>};
}

ElementRules element_rules(BlockElement e) {
  switch (e) {
    case BlockElement::e4m3:
      return rules_of<fr::E4M3>();
    case BlockElement::e5m2:
      return rules_of<fr::E5M2>();
    case BlockElement::e2m1:
      return rules_of<fr::E2M1>();
  }
  throw std::invalid_argument("unknown block element format");
}

// encode_block_rows for one element format: the encoder inlined into the loop (through
// ElementRules' pointers the call cost as much as the rounding).
template <class F>
void encode_rows_as(std::span<const float> x, std::int64_t cols, const BlockScaledLayout& layout,
                    const BlockEncodings& encodings, const BlockExtent& grid,
                    const BlockQuantizeOptions& options, std::int64_t row_begin,
                    std::int64_t row_end, std::span<std::uint8_t> codes) {
  for (std::int64_t r = row_begin; r < row_end; ++r) {
    const BlockEncoding* row_blocks =
        encodings.blocks.data() + static_cast<std::size_t>((r / layout.block_rows) * grid.cols);
    // Block by block along the row: no division per element.
    for (std::int64_t bc = 0; bc < grid.cols; ++bc) {
      const BlockEncoding& enc = row_blocks[bc];
      const std::int64_t c0 = bc * layout.block_cols;
      const std::int64_t c1 = std::min(cols, c0 + layout.block_cols);
      for (std::int64_t c = c0; c < c1; ++c) {
        const auto i = static_cast<std::size_t>(r * cols + c);
        if (!enc.finite) {
          codes[i] = 0;
          continue;
        }
        const float v = fr::block_scaled_value(x[i], enc.encode_scale);
        const u32 code = options.stochastic_rounding_seed
                             ? fr::encode_scaled_stochastic<F>(
                                   v, enc.pow2_shift, true,
                                   fr::random_bits(*options.stochastic_rounding_seed, i))
                             : fr::encode_scaled<F>(v, enc.pow2_shift, true);
        codes[i] = static_cast<std::uint8_t>(code);
      }
    }
  }
}

int mx_exponent(const BlockScaledLayout& layout, float amax) {
  const u32 a = fr::bits_of(amax);
  const bool floor_rule = layout.scale == BlockScale::e8m0;
  switch (layout.element) {
    case BlockElement::e4m3:
      return floor_rule ? fr::mx_scale_exponent_floor<fr::E4M3>(a)
                        : fr::mx_scale_exponent_round_up<fr::E4M3>(a);
    case BlockElement::e5m2:
      return floor_rule ? fr::mx_scale_exponent_floor<fr::E5M2>(a)
                        : fr::mx_scale_exponent_round_up<fr::E5M2>(a);
    case BlockElement::e2m1:
      return floor_rule ? fr::mx_scale_exponent_floor<fr::E2M1>(a)
                        : fr::mx_scale_exponent_round_up<fr::E2M1>(a);
  }
  throw std::invalid_argument("unknown block element format");
}

bool is_finite(float x) {
  return std::isfinite(x);
}

}  // namespace

BlockExtent block_along(ReductionAxis axis, std::int64_t n) {
  return axis == ReductionAxis::rows ? BlockExtent{n, 1} : BlockExtent{1, n};
}

BlockScaledLayout fp8_block_layout(ReductionAxis axis, BlockElement element,
                                   bool power_of_two_scales) {
  const BlockExtent b = block_along(axis, 128);
  return {element, power_of_two_scales ? BlockScale::fp32_pow2 : BlockScale::fp32, b.rows, b.cols,
          false};
}

BlockScaledLayout fp8_block_weight_layout(BlockElement element, bool power_of_two_scales) {
  return {element, power_of_two_scales ? BlockScale::fp32_pow2 : BlockScale::fp32, 128, 128, false};
}

BlockScaledLayout mx_layout(ReductionAxis axis, BlockElement element, MxScaleRule rule) {
  const BlockExtent b = block_along(axis, 32);
  const BlockScale scale = rule == MxScaleRule::ocp ? BlockScale::e8m0 : BlockScale::e8m0_round_up;
  return {element, scale, b.rows, b.cols, false};
}

BlockScaledLayout nvfp4_layout(ReductionAxis axis) {
  const BlockExtent b = block_along(axis, 16);
  return {BlockElement::e2m1, BlockScale::e4m3, b.rows, b.cols, true};
}

BlockScaledLayout nvfp4_weight_layout() {
  return {BlockElement::e2m1, BlockScale::e4m3, 16, 16, true};
}

std::string describe(const BlockScaledLayout& layout) {
  std::string s = std::string(element_name(layout.element)) + " " +
                  std::to_string(layout.block_rows) + "x" + std::to_string(layout.block_cols) +
                  " " + scale_name(layout.scale) + " scales";
  if (layout.tensor_scale) s += " + fp32 tensor scale";
  return s;
}

void check_layout(const BlockScaledLayout& layout) {
  if (!known_element(layout.element)) fail(layout, "unknown element format");
  if (layout.block_rows < 1 || layout.block_cols < 1)
    fail(layout, "block extents must be >= 1 (got " + std::to_string(layout.block_rows) + " x " +
                     std::to_string(layout.block_cols) + ")");
  switch (layout.scale) {
    case BlockScale::fp32:
    case BlockScale::fp32_pow2:
      if (layout.element == BlockElement::e2m1)
        fail(layout,
             "fp32 block scales go with fp8 elements (e4m3, e5m2); e2m1 takes e8m0 (MXFP4) "
             "or e4m3 (NVFP4) scales");
      break;
    case BlockScale::e8m0:
    case BlockScale::e8m0_round_up:
      break;
    case BlockScale::e4m3:
      if (layout.element != BlockElement::e2m1)
        fail(layout,
             "e4m3 block scales are NVFP4's and go with e2m1 elements; fp8 elements take "
             "fp32 or e8m0 scales");
      break;
    default:
      fail(layout, "unknown scale format");
  }
  if (layout.tensor_scale && layout.scale != BlockScale::e4m3)
    fail(layout,
         "a per-tensor scale is NVFP4's second level and needs e4m3 block scales; fp32 and "
         "e8m0 scales span the range alone");
}

BlockExtent block_grid(const BlockScaledLayout& layout, std::int64_t rows, std::int64_t cols) {
  check_layout(layout);
  checked_count(layout, rows, cols);
  return {rows / layout.block_rows + (rows % layout.block_rows != 0 ? 1 : 0),
          cols / layout.block_cols + (cols % layout.block_cols != 0 ? 1 : 0)};
}

BlockEncodings block_encodings(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                               const BlockScaledLayout& layout) {
  const BlockExtent grid = block_grid(layout, rows, cols);
  const std::int64_t n = checked_count(layout, rows, cols);
  if (static_cast<std::uint64_t>(x.size()) != static_cast<std::uint64_t>(n))
    fail(layout, "quantize of a " + std::to_string(rows) + " x " + std::to_string(cols) +
                     " tensor was given " + std::to_string(x.size()) + " values");

  const ElementRules er = element_rules(layout.element);
  const auto blocks = static_cast<std::size_t>(grid.rows * grid.cols);
  BlockEncodings encodings;
  encodings.blocks.resize(blocks);

  // First pass: each block's amax, and whether all its values are finite.
  struct BlockStats {
    float amax = 0.0f;
    bool finite = true;
  };
  std::vector<BlockStats> stats(blocks);
  for (std::int64_t r = 0; r < rows; ++r) {
    BlockStats* row_blocks =
        stats.data() + static_cast<std::size_t>((r / layout.block_rows) * grid.cols);
    for (std::int64_t bc = 0; bc < grid.cols; ++bc) {
      BlockStats& b = row_blocks[bc];
      const std::int64_t c1 = std::min(cols, (bc + 1) * layout.block_cols);
      for (std::int64_t c = bc * layout.block_cols; c < c1; ++c) {
        const float v = x[static_cast<std::size_t>(r * cols + c)];
        b.finite = b.finite && is_finite(v);
        b.amax = std::max(b.amax, std::fabs(v));
      }
    }
  }

  // NVFP4's first level: S_enc from the amax of the finite blocks. A non-finite block is NaN on
  // its own and must not shrink every other block's range.
  float s_enc = 1.0f;
  if (layout.tensor_scale) {
    float global_amax = 0.0f;
    for (const BlockStats& b : stats)
      if (b.finite) global_amax = std::max(global_amax, b.amax);
    s_enc = fr::nvfp4_tensor_encode_scale(global_amax);
    encodings.tensor_scale = fr::nvfp4_tensor_decode_scale(s_enc);
  }
  const float s_dec = encodings.tensor_scale;

  for (std::size_t block = 0; block < blocks; ++block) {
    BlockEncoding& enc = encodings.blocks[block];
    const float amax = stats[block].amax;
    if (!stats[block].finite) {
      // Codes stay 0; the scale alone makes the block NaN.
      enc.finite = false;
      enc.scale = std::numeric_limits<float>::quiet_NaN();
      enc.scale_code =
          static_cast<std::uint8_t>(layout.scale == BlockScale::e4m3 ? 0x7Fu : fr::kE8M0Nan);
      continue;
    }
    switch (layout.scale) {
      case BlockScale::fp32:
      case BlockScale::fp32_pow2: {
        // The rule the CUDA kernel shares (float_format_rules.h).
        const float s =
            fr::fp32_block_encode_scale(amax, er.max, layout.scale == BlockScale::fp32_pow2);
        enc.scale = fr::fp32_block_decode_scale(s);
        enc.encode_scale = s;
        break;
      }
      case BlockScale::e8m0:
      case BlockScale::e8m0_round_up: {
        const int k = mx_exponent(layout, amax);
        enc.scale_code = static_cast<std::uint8_t>(k + fr::kE8M0Bias);
        enc.pow2_shift = -k;
        break;
      }
      case BlockScale::e4m3: {
        // The rules the CUDA kernel shares (float_format_rules.h).
        const u32 d = fr::nvfp4_block_scale_code(amax, s_enc);
        enc.scale_code = static_cast<std::uint8_t>(d);
        enc.encode_scale = fr::nvfp4_block_encode_scale(fr::decode<fr::E4M3>(d), s_dec);
        break;
      }
    }
  }
  return encodings;
}

void encode_block_rows(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                       const BlockScaledLayout& layout, const BlockEncodings& encodings,
                       const BlockQuantizeOptions& options, std::int64_t row_begin,
                       std::int64_t row_end, std::span<std::uint8_t> codes) {
  const BlockExtent grid = block_grid(layout, rows, cols);
  const std::int64_t n = checked_count(layout, rows, cols);
  if (static_cast<std::int64_t>(x.size()) != n || static_cast<std::int64_t>(codes.size()) != n ||
      encodings.blocks.size() != static_cast<std::size_t>(grid.rows * grid.cols) || row_begin < 0 ||
      row_begin > row_end || row_end > rows)
    fail(layout, "encode_block_rows: x, codes and encodings must hold the " + std::to_string(rows) +
                     " x " + std::to_string(cols) +
                     " tensor's values and blocks, and the rows lie in it");
  switch (layout.element) {
    case BlockElement::e4m3:
      return encode_rows_as<fr::E4M3>(x, cols, layout, encodings, grid, options, row_begin, row_end,
                                      codes);
    case BlockElement::e5m2:
      return encode_rows_as<fr::E5M2>(x, cols, layout, encodings, grid, options, row_begin, row_end,
                                      codes);
    case BlockElement::e2m1:
      return encode_rows_as<fr::E2M1>(x, cols, layout, encodings, grid, options, row_begin, row_end,
                                      codes);
  }
  throw std::invalid_argument("unknown block element format");
}

BlockScaledTensor quantize_block_scaled(std::span<const float> x, std::int64_t rows,
                                        std::int64_t cols, const BlockScaledLayout& layout,
                                        const BlockQuantizeOptions& options) {
  const BlockEncodings encodings = block_encodings(x, rows, cols, layout);
  BlockScaledTensor t;
  t.layout = layout;
  t.rows = rows;
  t.cols = cols;
  t.codes.assign(x.size(), 0);
  if (layout.tensor_scale) t.tensor_scale = encodings.tensor_scale;
  for (const BlockEncoding& enc : encodings.blocks)
    if (fp32_scales(layout.scale))
      t.scales.push_back(enc.scale);
    else
      t.scale_codes.push_back(enc.scale_code);
  encode_block_rows(x, rows, cols, layout, encodings, options, 0, rows, t.codes);
  return t;
}

namespace {
// The value of a stored scale code (E4M3 or E8M0 layouts).
float decode_scale_code(const BlockScaledLayout& layout, std::uint8_t code) {
  return layout.scale == BlockScale::e4m3 ? fr::decode<fr::E4M3>(code) : fr::decode_e8m0(code);
}
}  // namespace

float block_scale_value(const BlockScaledLayout& layout, const BlockEncoding& encoding) {
  if (fp32_scales(layout.scale)) return encoding.scale;
  return decode_scale_code(layout, encoding.scale_code);
}

float block_scale_value(const BlockScaledTensor& t, std::int64_t block_row,
                        std::int64_t block_col) {
  const BlockExtent grid = block_grid(t.layout, t.rows, t.cols);
  if (block_row < 0 || block_row >= grid.rows || block_col < 0 || block_col >= grid.cols)
    fail(t.layout, "block (" + std::to_string(block_row) + ", " + std::to_string(block_col) +
                       ") is outside the " + std::to_string(grid.rows) + " x " +
                       std::to_string(grid.cols) + " grid");
  const auto i = static_cast<std::size_t>(block_row * grid.cols + block_col);
  const auto count = static_cast<std::size_t>(grid.rows * grid.cols);
  if (fp32_scales(t.layout.scale)) {
    if (t.scales.size() != count) fail(t.layout, "the fp32 scales do not match the block grid");
    return t.scales[i];
  }
  if (t.scale_codes.size() != count) fail(t.layout, "the scale codes do not match the block grid");
  return decode_scale_code(t.layout, t.scale_codes[i]);
}

std::vector<float> dequantize_block_scaled(const BlockScaledTensor& t) {
  const BlockScaledLayout& layout = t.layout;
  const BlockExtent grid = block_grid(layout, t.rows, t.cols);
  const std::int64_t n = checked_count(layout, t.rows, t.cols);
  const auto blocks = static_cast<std::size_t>(grid.rows * grid.cols);
  if (t.codes.size() != static_cast<std::size_t>(n))
    fail(layout, "holds " + std::to_string(t.codes.size()) + " codes for a " +
                     std::to_string(t.rows) + " x " + std::to_string(t.cols) + " tensor");
  const std::size_t want_fp32 = fp32_scales(layout.scale) ? blocks : 0;
  const std::size_t want_codes = fp32_scales(layout.scale) ? 0 : blocks;
  if (t.scales.size() != want_fp32 || t.scale_codes.size() != want_codes)
    fail(layout, "holds " + std::to_string(t.scales.size()) + " fp32 scales and " +
                     std::to_string(t.scale_codes.size()) + " scale codes; its " +
                     std::to_string(grid.rows) + " x " + std::to_string(grid.cols) +
                     " blocks need " + std::to_string(blocks) + " " +
                     (fp32_scales(layout.scale) ? "fp32 scales" : "scale codes") + " only");
  if (!layout.tensor_scale && t.tensor_scale != 1.0f)
    fail(layout, "has a tensor scale of " + std::to_string(t.tensor_scale) +
                     " but the layout has no second level");
  if (layout.element == BlockElement::e2m1)
    for (std::uint8_t c : t.codes)
      if (c > 0xF) fail(layout, "holds an e2m1 code above 0xF: " + std::to_string(c));

  std::vector<float> block_scales(blocks);
  for (std::size_t b = 0; b < blocks; ++b)
    block_scales[b] =
        fp32_scales(layout.scale) ? t.scales[b] : decode_scale_code(layout, t.scale_codes[b]);

  const ElementRules er = element_rules(layout.element);
  std::vector<float> out(static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < t.rows; ++r)
    for (std::int64_t c = 0; c < t.cols; ++c) {
      const auto i = static_cast<std::size_t>(r * t.cols + c);
      const float scale = block_scales[static_cast<std::size_t>(
          (r / layout.block_rows) * grid.cols + c / layout.block_cols)];
      // code (<= 4 significant bits) × scale (<= 24) × tensor scale (24) is exact in double
      // (52 bits, and far from double's range limits): one rounding, to fp32.
      const double v = static_cast<double>(er.decode(t.codes[i])) * static_cast<double>(scale) *
                       static_cast<double>(t.tensor_scale);
      out[i] = static_cast<float>(v);
    }
  return out;
}

std::array<float, 256> hadamard16(std::uint64_t sign_seed) {
  std::array<float, 256> m{};
  for (int j = 0; j < 16; ++j) {
    const bool negative = (fr::random_bits(sign_seed, static_cast<std::uint64_t>(j)) & 1u) != 0;
    for (int i = 0; i < 16; ++i) {
      const bool odd = (std::popcount(static_cast<unsigned>(i & j)) & 1) != 0;
      m[static_cast<std::size_t>(i * 16 + j)] = (odd != negative) ? -0.25f : 0.25f;
    }
  }
  return m;
}

std::vector<std::uint8_t> pack_e2m1(std::span<const std::uint8_t> codes) {
  std::vector<std::uint8_t> packed((codes.size() + 1) / 2, 0);
  for (std::size_t i = 0; i < codes.size(); ++i) {
    if (codes[i] > 0xF)
      throw std::invalid_argument("pack_e2m1: code " + std::to_string(codes[i]) + " at index " +
                                  std::to_string(i) + " is not a 4-bit e2m1 code");
    packed[i / 2] = static_cast<std::uint8_t>(packed[i / 2] | (codes[i] << (4 * (i % 2))));
  }
  return packed;
}

std::vector<std::uint8_t> unpack_e2m1(std::span<const std::uint8_t> packed, std::size_t count) {
  if (packed.size() != (count + 1) / 2)
    throw std::invalid_argument("unpack_e2m1: " + std::to_string(count) + " codes take " +
                                std::to_string((count + 1) / 2) + " bytes, not " +
                                std::to_string(packed.size()));
  std::vector<std::uint8_t> codes(count);
  for (std::size_t i = 0; i < count; ++i)
    codes[i] = static_cast<std::uint8_t>((packed[i / 2] >> (4 * (i % 2))) & 0xF);
  return codes;
}

}  // namespace mixtrain::sdk
