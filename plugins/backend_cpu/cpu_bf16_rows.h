// Strided rows of bf16 storage decoded to fp32 and encoded back, inline (cpu_bf16_bits.h), for
// kernels that convert many short rows: the SDK's bulk converter costs a call per row, which for
// rows of a head's 32 elements cost more than the conversion itself (flash attention's bf16
// backward spent 30% of its time there).
//
// Contract
// - decode_bf16_rows: dst [count, d] (row-major, dense) = the exact fp32 values of `count` rows of
//   `d` elements at src, src + stride, ... (stride in elements, >= d): each value's bits shifted
//   into place, so a signalling NaN stays signalling (the SDK's decoder quiets it; the first
//   arithmetic on it does the same).
// - encode_bf16_rows: the `count` rows of `d` at dst, dst + stride, ... = src [count, d] rounded
//   once, to nearest even, NaNs quieted: the SDK's encode_bf16 with Overflow::to_inf_or_nan, bit
//   for bit.
// - Buffers do not overlap. Run on the calling thread; compiled for x86-64-v4, x86-64-v3 and the
//   baseline (cpu_isa.h), cpuid picking one.
#pragma once

#include <cstdint>

#include "cpu_bf16_bits.h"

namespace mixtrain::backend_cpu {

void decode_bf16_rows(const Bf16Bits* src, std::int64_t stride, std::int64_t count, std::int64_t d,
                      float* dst);
void encode_bf16_rows(const float* src, std::int64_t count, std::int64_t d, Bf16Bits* dst,
                      std::int64_t stride);

}  // namespace mixtrain::backend_cpu
