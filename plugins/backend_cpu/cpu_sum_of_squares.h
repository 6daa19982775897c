// Σ x² in double, the gradient norm's sum: over a list of storage-dtype tensors (fp32, bf16, fp16),
// each element decoded exactly; what the gradient check reports and CpuBackend's diagnostic
// returns.
//
// Contract
// - sum_of_squares(context, tensors): OpenMP over pieces (cpu_pieces.h); each piece's sum is kept
//   and the pieces' sums are added in order afterwards, so the result has the same bits on any
//   number of threads. Throws sdk::BackendError for a tensor of another dtype.
// - chunk_sum_of_squares(x, len): one chunk's Σ x², len <= kChunk, compiled per ISA (cpu_isa.h).
//   A piece's sum is its chunks' sums added in order, starting at 0. The gradient check's fused
//   pass (facets/cpu_gradient_check.cpp) sums the same way, so both give the same bits.
#pragma once

#include <cstdint>
#include <span>

#include "cpu_context.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::backend_cpu {

double sum_of_squares(const CpuContext& context, std::span<const sdk::TensorView> tensors);

double chunk_sum_of_squares(const float* x, std::int64_t len);

}  // namespace mixtrain::backend_cpu
