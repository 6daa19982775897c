// Block-scaled weights decoded on the CPU (the quantized_weight facet's dequantize_block_scaled:
// a frozen base stored as train.frozen_format = "fp8-block" or "mxfp8", decoded before every GEMM
// that reads it).
//
// Contract
// - decode_block_scaled: out [rows, cols] (fp32 / bf16 / fp16 storage) receives element (r, c) =
//   values[code] · scale(r / block_rows, c / block_cols) · tensor_scale, in double (exact),
//   rounded once to fp32, then once (RNE) into out's dtype: bit for bit
//   sdk/support/block_scaling.h's dequantize_block_scaled and that rounding. codes: one byte an
//   element, row-major, or with `packed` two (element i in the low nibble of byte i / 2 when i is
//   even, the high one when odd, E2M1's order); values: the element format's 256 decoded codes
//   (block_element_values); scales (BlockScales): the grid of each block's decode scale,
//   [rows / block_rows rounded up, grid_cols], as fp32 values or as byte codes (E8M0, E4M3) with
//   their 256 decoded values. The caller checked every size.
// - How: a row's run of block_cols elements shares one scale, so scale · tensor_scale is formed
//   once in double; each element's value times it is the reference's two products in another
//   order, and the same double: both are exact (a code has at most 4 significant bits, each
//   scale 24, 52 in all, far inside double's range). With a tensor scale of 1 (every frozen
//   base's layout) the one product is fp32's own multiply, which rounds it once as the exact
//   double rounded to fp32 does. The element loop is compiled per ISA (cpu_isa.h: the lookups as
//   gathers) and picked by cpuid; the bits are the same on every variant. OpenMP over rows: any
//   thread count, the same bits. GPT-2 small's fp8-block and mxfp8 bases: bench/RESULTS.md,
//   sessions 76, 79 and 80.
// - Into a 16-bit out on AVX-512 (session 79), 1-byte codes go through tables of the 256 codes'
//   values, each formed by the expression above and rounded once as the row path rounds, so the
//   same bits: a table per block where a block holds at least 4,096 elements (fp8-block's
//   128x128), else, where the scales are byte codes and a block's row holds at least 32 codes
//   (MX along the columns), a table per scale code, indexed by the code itself. The codes are
//   looked up 32 at a time (vpermi2w), in half the table where its upper half is the lower one
//   negated (an FP8 element's sign bit). Into bf16 with power-of-two scale codes (MX's E8M0) and
//   no tensor scale, one table of the codes' own values serves every block: its exponents are
//   shifted by the block's (exact while the results stay normal bf16 numbers; a scale code that
//   would leave that range keeps its own table). bench/RESULTS.md, session 81.
#pragma once

#include <array>
#include <cstdint>

#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::backend_cpu {

// A decode's grid of block scales, [grid_rows, grid_cols] row-major: fp32 values, or byte codes
// with the 256 codes' decoded values (E8M0 and E4M3 decode exactly into fp32). Non-owning.
struct BlockScales {
  std::int64_t grid_cols = 0;
  const float* values = nullptr;  // fp32 scales; null when codes are given
  const std::uint8_t* codes = nullptr;
  const std::array<float, 256>* code_values = nullptr;

  bool coded() const { return codes != nullptr; }
  float at(std::int64_t block_row, std::int64_t block_col) const {
    const std::int64_t i = block_row * grid_cols + block_col;
    return coded() ? (*code_values)[codes[i]] : values[i];
  }
};

void decode_block_scaled(const std::uint8_t* codes, bool packed,
                         const std::array<float, 256>& values, const BlockScales& scales,
                         std::int64_t block_rows, std::int64_t block_cols, float tensor_scale,
                         const sdk::TensorView& out);

}  // namespace mixtrain::backend_cpu
