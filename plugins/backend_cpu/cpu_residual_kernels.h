// The residual join's backward as one element-wise loop (the ResidualFacet's add_backward).
//
// Contract
// - residual_backward_pair(dy, y, a, b, n): for each element i of [0, n), g = dy[i], or +0 where
//   y[i] is not positive (NaN included) when y is not empty; g is stored into a[i] and b[i], each
//   rounded once (RNE, NaN quieted: cpu_bf16_bits.h) into its own storage. A one-gradient call
//   passes the same output twice.
// - Storages: dy, y, a and b each fp32 or bf16 (typed_storage(), cpu_typed_storage.h); y is empty
//   for the backward without the ReLU. fp16 and more than two gradients are the caller's generic
//   path (read_chunk / commit_chunk).
// - Aliasing: a (or b) may be dy itself in dy's storage (each element is read before it is
//   written); otherwise the outputs are disjoint from dy, y and each other.
// - The result is the generic chunked path's bit for bit (the same mask, the same rounding), on
//   any ISA and thread count: the loop is element-wise. OpenMP over blocks of elements with the
//   calling thread's team (parallel_worth); compiled for x86-64-v4, x86-64-v3 and the baseline,
//   cpuid picks one (cpu_isa.h).
#pragma once

#include <cstdint>

#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::backend_cpu {

void residual_backward_pair(const sdk::TensorView& dy, const sdk::TensorView& y,
                            const sdk::TensorView& a, const sdk::TensorView& b, std::int64_t n);

}  // namespace mixtrain::backend_cpu
