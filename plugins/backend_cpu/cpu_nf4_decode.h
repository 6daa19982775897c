// NF4 weights decoded on the CPU (the quantized_weight facet's dequantize_nf4, QLoRA's frozen
// base, decoded before every GEMM that reads it).
//
// Contract
// - decode_nf4: out (fp32 / bf16 / fp16 storage, n = out.numel() elements read flat) receives
//   element i = kNf4Codebook[code_i] · absmax[i / block], one fp32 product, rounded once into out's
//   dtype: bit for bit sdk/support/nf4.h's nf4_dequantize and that rounding, as
//   sdk/backend_quantized_weight.h states it. codes holds nf4_code_bytes(n) bytes (element 2i in
//   the high nibble), absmax nf4_block_count(n, block) fp32 values; the caller checked both.
// - How: per block, its 16 possible values (each the reference's fp32 product) are rounded into
//   out's dtype once, as a table, and each element is a lookup by its code; no division or
//   conversion per element. A whole 16-bit block of a multiple of 32 elements (QLoRA's 64) is
//   looked up 32 elements at a time: with AVX-512 (x86-64-v4) by one vpermw of the table in a
//   register, else its table's low and high bytes read by pshufb (SSSE3, on any x86-64-v3 CPU);
//   under limit_isa(baseline), and for other blocks, one element at a time. The same lookups
//   every way, so the same bits. The tables' products are compiled per ISA too (one multiply a
//   block on AVX-512). OpenMP over runs of whole blocks, so the result does not depend on the
//   thread count. GPT-2 small's c_fc (2.36 M elements into bf16): the per-element reference path
//   took 4.8 ms a decode (session 74), the element lookups 1.4-1.5, the byte tables 0.53-0.61
//   (bench/RESULTS.md, session 76); bench_frozen_decode's [768, 3072]: 0.228 ms with the byte
//   tables, 0.14 with vpermw and the per-ISA products (session 80).
#pragma once

#include <cstdint>

#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::backend_cpu {

void decode_nf4(const std::uint8_t* codes, const float* absmax, std::int64_t block,
                const sdk::TensorView& out);

}  // namespace mixtrain::backend_cpu
