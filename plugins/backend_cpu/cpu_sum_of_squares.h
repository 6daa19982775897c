// Σ x² in double, the gradient norm's sum: over a list of storage-dtype tensors (fp32, bf16, fp16),
// each element decoded exactly; what the gradient check reports and CpuBackend's diagnostic
// returns.
//
// Contract
// - sum_of_squares(context, tensors): OpenMP over pieces (cpu_pieces.h); each piece's sum is kept
//   and the pieces' sums are added in order afterwards, so the result has the same bits on any
//   number of threads. Throws sdk::BackendError for a tensor of another dtype.
// - chunk_sum_of_squares(x, len): one chunk's Σ x², len <= kChunk, compiled per ISA (cpu_isa.h):
//   32 double lanes (lane j sums elements j, j+32, ...), added pairwise in a fixed tree, so the
//   bits are the same on every ISA. A piece's sum is its chunks' sums added in order, from 0.
// - chunk_scale_and_check(x, len, scale, sum_squares): the gradient check's pass over one chunk:
//   x *= scale in place (x untouched at scale 1), whether any scaled value is inf or NaN, and,
//   when asked, Σ x² of the scaled values, summed as chunk_sum_of_squares sums, so the fused
//   check (facets/cpu_gradient_check.cpp) and sum_of_squares() give the same bits.
#pragma once

#include <cstdint>
#include <span>

#include "cpu_context.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::backend_cpu {

double sum_of_squares(const CpuContext& context, std::span<const sdk::TensorView> tensors);

double chunk_sum_of_squares(const float* x, std::int64_t len);

struct ChunkCheck {
  int nonfinite = 0;  // 1 when a value is inf or NaN
  double sum_of_squares = 0.0;
};
ChunkCheck chunk_scale_and_check(float* x, std::int64_t len, float scale, bool sum_squares);

}  // namespace mixtrain::backend_cpu
