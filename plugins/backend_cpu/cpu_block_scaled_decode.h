// Block-scaled weights decoded on the CPU (the quantized_weight facet's dequantize_block_scaled:
// a frozen base stored as train.frozen_format = "fp8-block" or "mxfp8", decoded before every GEMM
// that reads it).
//
// Contract
// - decode_block_scaled: out [rows, cols] (fp32 / bf16 / fp16 storage) receives element (r, c) =
//   values[code] · scales[r / block_rows][c / block_cols] · tensor_scale, in double (exact),
//   rounded once to fp32, then once (RNE) into out's dtype: bit for bit
//   sdk/support/block_scaling.h's dequantize_block_scaled and that rounding. codes: one byte an
//   element, row-major, or with `packed` two (element i in the low nibble of byte i / 2 when i is
//   even, the high one when odd, E2M1's order); values: the element format's 256 decoded codes
//   (block_element_values); scales: [rows / block_rows rounded up, grid_cols] fp32, each block's
//   decode scale. The caller checked every size.
// - How: a row's run of block_cols elements shares one scale, so scale · tensor_scale is formed
//   once in double; each element's value times it is the reference's two products in another
//   order, and the same double: both are exact (a code has at most 4 significant bits, each
//   scale 24, 52 in all, far inside double's range). With a tensor scale of 1 (every frozen
//   base's layout) the one product is fp32's own multiply, which rounds it once as the exact
//   double rounded to fp32 does. The element loop is compiled per ISA (cpu_isa.h: the lookups as
//   gathers) and picked by cpuid; the bits are the same on every variant. OpenMP over rows: any
//   thread count, the same bits. GPT-2 small's fp8-block and mxfp8 bases: bench/RESULTS.md,
//   session 76.
// - Into a 16-bit out on AVX-512 (session 79), 1-byte codes go through tables of the 256 codes'
//   values, each formed by the expression above and rounded once as the row path rounds, so the
//   same bits: a table per block where a block holds at least 4,096 elements (fp8-block's
//   128x128), else, when byte_scales says the scales are E8M0 or E4M3 codes (at most 256 distinct
//   values) and a block's row holds at least 32 codes (MX along the columns), a table per distinct
//   scale. The codes are looked up 32 at a time (vpermi2w).
#pragma once

#include <array>
#include <cstdint>

#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::backend_cpu {

void decode_block_scaled(const std::uint8_t* codes, bool packed,
                         const std::array<float, 256>& values, const float* scales,
                         std::int64_t grid_cols, std::int64_t block_rows, std::int64_t block_cols,
                         bool byte_scales, float tensor_scale, const sdk::TensorView& out);

}  // namespace mixtrain::backend_cpu
