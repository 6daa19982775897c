// Block-scaled tensor encodings — narrow elements (fp8 E4M3 / E5M2, fp4 E2M1) that share one
// scale per block — and their host reference quantize / dequantize: exact to the definitions
// below, written for clarity, not speed (the kernels that implement them are tested against it).
//
// Layout. A tensor is rows × cols, row-major (cols contiguous). A block is block_rows × block_cols
// elements; 1×N blocks run along the columns, N×1 along the rows, N×N are 2-D (weights). The
// blocks tile the tensor from (0, 0); a trailing partial block holds the elements that are there,
// and is quantized exactly as the full block the tensor zero-padded to a multiple would give (as
// Transformer Engine pads): the scale grid is ceil(rows / block_rows) × ceil(cols / block_cols),
// row-major. block_along() places a 1×N block along a GEMM operand's reduction dimension.
//
// The encodings (element, scale):
// - FP8 block scaling (Transformer Engine's Float8BlockScaling, DeepSeek-V3's 1×128 / 128×128
//   tiles): E4M3 or E5M2 elements, fp32 scales. Per block, with fp32 arithmetic (each step one
//   IEEE operation rounded to nearest even): s = max_elem / amax (amax 0: s = 1; an infinite s
//   becomes FLT_MAX); fp32_pow2 then rounds s down to a power of two. The stored (decode) scale is
//   1 / s, the element codes encode(x·s), saturating.
// - MX (OCP Microscaling Formats (MX) v1.0: MXFP8, MXFP4): E4M3, E5M2 or E2M1 elements, one E8M0
//   scale 2^k per block (the spec's block is 1×32), codes encode(x·2^-k) with x·2^-k exact,
//   saturating. e8m0: the spec's k = floor(log2 amax) - emax_elem (E4M3 8, E5M2 15, E2M1 2), so a
//   block's amax lands in the element format's top binade, and values between its max and
//   2^(emax_elem + 1) saturate (the spec's conversion, section 6.3, clamps them to the element
//   format's max). e8m0_round_up: the
//   smallest k with amax <= max_elem·2^k, no element saturating (Transformer Engine's MXFP8). Both
//   clamp k to [-127, 127]; amax 0 gives k = -127 (code 0x00).
// - NVFP4: E2M1 elements, E4M3 scales (1×16 activations, 16×16 weights), and with tensor_scale the
//   second level, one fp32 scale per tensor. In fp32 arithmetic, as Transformer Engine's kernels:
//     S_enc = 6·448 / global_amax (the largest amax of the tensor's finite blocks; 0 gives
//             S_enc = 1; an infinite quotient FLT_MAX), S_enc = 1 without tensor_scale;
//     stored tensor scale S_dec = 1 / S_enc;
//     block scale d = E4M3(amax · (S_enc · (1/6))), rounded to nearest even, saturating at 448;
//     element codes E2M1(x · e), e = min(1 / (d · S_dec), FLT_MAX) — or e = 0 when d is 0, so a
//     block whose scale underflows stores signed zeros (Transformer Engine's kernels would
//     multiply by FLT_MAX and store ±6, which dequantize to 0 all the same).
//   Without tensor_scale a block with amax above 6·448 saturates its scale, then its elements.
// Rounding of elements: to nearest even, or stochastic (BlockQuantizeOptions), for every encoding.
//
// Special blocks: a block holding a NaN or an infinity has a NaN scale (fp32 quiet NaN, E8M0
// 0xFF, E4M3 0x7F) and all-zero codes, so every element of it dequantizes to NaN — as Microsoft's
// microxcaling, the MX spec's reference code, computes (the shared exponent of an infinite or NaN
// amax is NaN; Transformer Engine's FP8 block reference ends with NaNs there too). Its values
// take no part in the tensor's global amax: the other blocks quantize exactly as they would with
// that block zeroed. A block of zeros has scale 1 (fp32), 2^-127 (E8M0) or 0 (E4M3), and codes
// that are (signed) zeros.
//
// Dequantize: each element is code value × block scale × tensor scale, the exact product rounded
// once to fp32 (nearest even).
//
// Codes: one element per byte, row-major; E2M1 in the low nibble (pack_e2m1 stores two per byte).
// Errors: std::invalid_argument, naming the problem, for a layout outside the combinations above
// or with a block extent < 1, a size mismatch, a tensor whose element count overflows, or (on
// dequantize) a code or scale buffer that does not fit its layout. The fp32 steps assume the
// default floating-point environment (no FTZ / DAZ), which the tests run in.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mixtrain/sdk/backend_gemm.h"

namespace mixtrain::sdk {

// BlockElement, BlockScale, BlockScaledLayout and ReductionAxis are declared with the GEMM facet
// (backend_gemm.h), whose block-scaled operands carry them.

// A 1×n block along `axis`: {1, n} for cols, {n, 1} for rows (the rows of the transpose).
struct BlockExtent {
  std::int64_t rows, cols;
};
BlockExtent block_along(ReductionAxis axis, std::int64_t n);

// The recipes' layouts. FP8 block scaling: 1×128 activations / gradients, 128×128 weights.
BlockScaledLayout fp8_block_layout(ReductionAxis axis, BlockElement element = BlockElement::e4m3,
                                   bool power_of_two_scales = false);
BlockScaledLayout fp8_block_weight_layout(BlockElement element = BlockElement::e4m3,
                                          bool power_of_two_scales = false);
// MX: 1×32 along the reduction dimension, E8M0 scales by the OCP rule (floor) or rounded up
// (Transformer Engine's MXFP8 default: the scale that saturates nothing).
enum class MxScaleRule { ocp, round_up };
BlockScaledLayout mx_layout(ReductionAxis axis, BlockElement element,
                            MxScaleRule rule = MxScaleRule::ocp);
// NVFP4 with its per-tensor scale: 1×16 activations / gradients, 16×16 weights.
BlockScaledLayout nvfp4_layout(ReductionAxis axis);
BlockScaledLayout nvfp4_weight_layout();

// Throws std::invalid_argument unless the layout is one of the combinations above.
void check_layout(const BlockScaledLayout& layout);
// "e2m1 1x16 e4m3 scales + fp32 tensor scale", for messages.
std::string describe(const BlockScaledLayout& layout);

// The number of blocks along each dimension (ceil division); checks the layout and the sizes.
BlockExtent block_grid(const BlockScaledLayout& layout, std::int64_t rows, std::int64_t cols);

struct BlockScaledTensor {
  BlockScaledLayout layout;
  std::int64_t rows = 0, cols = 0;
  std::vector<std::uint8_t> codes;  // rows·cols element codes
  // One scale per block of block_grid(): fp32 / fp32_pow2 layouts fill `scales` (decode scales),
  // e8m0 / e4m3 layouts `scale_codes`; the other stays empty.
  std::vector<float> scales;
  std::vector<std::uint8_t> scale_codes;
  float tensor_scale = 1.0f;  // S_dec with tensor_scale, else 1
};

struct BlockQuantizeOptions {
  // Stochastic rounding of the elements (NVFP4's gradients): element (r, c) rounds with the bits
  // format_rules::random_bits(seed, r·cols + c), so a seed fixes the result, on any device.
  // Scales always round to nearest even.
  std::optional<std::uint64_t> stochastic_rounding_seed;
};

// How quantize_block_scaled encodes one block, from its amax (and NVFP4's tensor amax): each
// element's code is the element format's encode of x·encode_scale, then an exact 2^pow2_shift,
// saturating. fp32 and NVFP4 blocks use the fp32 product (pow2_shift 0); MX blocks the exact power
// of two (encode_scale 1), which no fp32 product could give for every element (x·2^-k may fall
// outside fp32's normal range and round on its own). The stored scale is `scale` (the decode
// scale, fp32 / fp32_pow2 layouts) or `scale_code` (E8M0 / E4M3). A block holding a non-finite
// value has finite false, a NaN scale and codes left 0.
struct BlockEncoding {
  float encode_scale = 1.0f;
  int pow2_shift = 0;
  float scale = 0.0f;
  std::uint8_t scale_code = 0;
  bool finite = true;
};
struct BlockEncodings {
  std::vector<BlockEncoding> blocks;  // one per block of block_grid(), row-major
  float tensor_scale = 1.0f;          // S_dec with tensor_scale, else 1
};
// Every block's encoding of x (rows·cols fp32 values, row-major): the first half of
// quantize_block_scaled, for a caller that classifies the elements itself.
BlockEncodings block_encodings(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                               const BlockScaledLayout& layout);

// The second half: quantize_block_scaled's codes of rows [row_begin, row_end) of x, written to
// those rows of `codes` (rows·cols bytes, indexed as x), from block_encodings(x, ...). The rows
// are independent, so a backend splits them over threads. Throws std::invalid_argument when the
// sizes do not fit.
void encode_block_rows(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                       const BlockScaledLayout& layout, const BlockEncodings& encodings,
                       const BlockQuantizeOptions& options, std::int64_t row_begin,
                       std::int64_t row_end, std::span<std::uint8_t> codes);
// The decoded scale of one block's encoding (what block_scale_value returns for it).
float block_scale_value(const BlockScaledLayout& layout, const BlockEncoding& encoding);

// x: rows·cols fp32 values, row-major. Returns codes and scales as defined above.
BlockScaledTensor quantize_block_scaled(std::span<const float> x, std::int64_t rows,
                                        std::int64_t cols, const BlockScaledLayout& layout,
                                        const BlockQuantizeOptions& options = {});
// rows·cols fp32 values; checks that codes and scales fit the layout first.
std::vector<float> dequantize_block_scaled(const BlockScaledTensor& t);
// The decoded scale of block (block_row, block_col), the tensor scale not applied.
float block_scale_value(const BlockScaledTensor& t, std::int64_t block_row, std::int64_t block_col);

// The random Hadamard transform of NVFP4's wgrad inputs (policy_block_scaling.h 1.1): the 16×16
// matrix M = H·D/4, row-major, H Sylvester's Walsh–Hadamard matrix (H[i][j] = (−1)^popcount(i&j)),
// D = diag(s_0 … s_15) with s_j = −1 when bit 0 of format_rules::random_bits(sign_seed, j) is set.
// Every entry is ±1/4, so M is exact in any float format and MᵀM = I exactly.
std::array<float, 256> hadamard16(std::uint64_t sign_seed);

// Two E2M1 codes per byte, element 2i in the low nibble (Transformer Engine's and CUDA's fp4x2
// order); an odd count leaves the last high nibble 0. Codes must be < 16.
std::vector<std::uint8_t> pack_e2m1(std::span<const std::uint8_t> codes);
// The first `count` codes of packed storage; packed must hold ceil(count / 2) bytes.
std::vector<std::uint8_t> unpack_e2m1(std::span<const std::uint8_t> packed, std::size_t count);

}  // namespace mixtrain::sdk
