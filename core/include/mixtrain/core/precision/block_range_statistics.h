// Block range statistics of one GEMM operand: how many of its values each block-scaled recipe
// (sdk/support/block_scaling.h) saturates or flushes to zero with one scale per block, against the
// same element format with one scale for the whole tensor — what calibration's block report and
// its block-policy rule read (docs/precision-autopilot.md, "Block scaling").
//
// Contract
// - The formats are the block-scaled policies' defaults unless the layouts are given
//   (plugins/block_scaling), named as those
//   policies: fp8-block (E4M3, fp32 block scales; 1×128 along the reduction dim, 128×128
//   weights), mxfp8 (E4M3, E8M0 round-up scales, 1×32), nvfp4 (E2M1, E4M3 block scales and the
//   fp32 tensor scale; 1×16, 16×16 weights). block_layout() gives the layout per role.
// - measure_blocks() reads a rows × cols fp32 tensor, row-major, as the GEMM that quantizes it
//   first reads it: activations and gradients with their 1-D blocks along the columns (forward's
//   x along in, dgrad's dy along out), weights [out, in] in the recipe's weight layout. Counts
//   are of the finite non-zero values. A tensor holding a NaN or ±inf is counted in `skipped`
//   and takes part in nothing else (its blocks would be NaN; range_statistics counts those).
//   Never throws for a shape that fits the values; std::invalid_argument when rows·cols differs
//   from the span's size.
// - Per format, two counts: per_block, the recipe's own per-block scales, exactly as
//   quantize_block_scaled computes them (each block's scale from its amax, the element
//   x·scale rounded to nearest even once); per_tensor, one scale for the whole tensor in the same
//   element format, tensor_scale()'s formula (range_statistics.h: the format's max over the
//   tensor's amax, in double, rounded once to fp32) — for E4M3 exactly range_statistics' scaled
//   e4m3 counts. `flushed`: a non-zero value whose code is ±0 (it dequantizes to 0; an nvfp4
//   block whose E4M3 scale underflows flushes all its values). `saturated`: a value whose scaled
//   magnitude rounds past the element format's largest finite value, which the saturating
//   quantizer clamps to it (E4M3 from 464 up, 464 itself rounding to 448; E2M1 from 7 up).
// - merge() adds a later measurement into an aggregate.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "mixtrain/sdk/support/block_scaling.h"

namespace mixtrain::core {

enum class BlockFormat { fp8_block, mxfp8, nvfp4 };
inline constexpr std::array<BlockFormat, 3> kBlockFormats = {
    BlockFormat::fp8_block, BlockFormat::mxfp8, BlockFormat::nvfp4};
// The policy's name: "fp8-block", "mxfp8", "nvfp4".
const char* block_format_name(BlockFormat f);
// The element format's name for the per-tensor column: "e4m3", "e2m1".
const char* block_element_name(BlockFormat f);

enum class BlockRole { activation, weight };
sdk::BlockScaledLayout block_layout(BlockFormat f, BlockRole role);

struct BlockCounts {
  std::int64_t flushed = 0, saturated = 0;
};

struct BlockRangeStatistics {
  std::int64_t nonzero = 0;  // finite non-zero values counted: the base of every share
  std::int64_t skipped = 0;  // tensors left out for holding a non-finite value
  std::array<BlockCounts, kBlockFormats.size()> per_tensor{}, per_block{};  // kBlockFormats order

  double share(std::int64_t n) const {
    return nonzero > 0 ? static_cast<double>(n) / static_cast<double>(nonzero) : 0.0;
  }
};

// One format's counts with the recipe's per-block scales (block_encodings, the quantizer's own),
// for any layout block_scaling.h accepts; x finite (measure_blocks skips a tensor that is not).
BlockCounts count_per_block(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                            const sdk::BlockScaledLayout& layout);
// One format's counts with a single per-tensor scale; `element` e4m3, e5m2 or e2m1.
BlockCounts count_per_tensor(std::span<const float> x, sdk::BlockElement element);

BlockRangeStatistics measure_blocks(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                                    BlockRole role);
// The same with each format's layout given (kBlockFormats order): a configured policy's own
// options (mxfp8's scale_rule or fp8_format, fp8-block's power-of-two scales) in place of the
// defaults.
using BlockLayouts = std::array<sdk::BlockScaledLayout, kBlockFormats.size()>;
BlockLayouts default_block_layouts(BlockRole role);
BlockRangeStatistics measure_blocks(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                                    const BlockLayouts& layouts);
void merge(BlockRangeStatistics& into, const BlockRangeStatistics& step);

// The shares of normally distributed values that `layout`'s per-block scaling flushes to zero
// and saturates: what the format loses of well-behaved data by its own design (E2M1 has nothing
// between 0 and 1/12 of a block's largest value, about 7% of normal values in blocks of 16, and
// NVFP4's E4M3 block scale, rounded, may put a block's largest value past 6; E4M3 elements with
// fp32 or E8M0 scales lose almost nothing). Measured once per layout on 2^18 values drawn with a
// fixed seed, then cached; thread-safe.
struct BlockShares {
  double flushed = 0.0, saturated = 0.0;
};
BlockShares normal_block_shares(const sdk::BlockScaledLayout& layout);

}  // namespace mixtrain::core
