// The residual join's backward as one element-wise loop (the ResidualFacet's add_backward).
//
// Contract
// - residual_backward_pair(dy, y, a, b): for each element i of [0, n), g = dy[i], or +0 where
//   y[i] is not positive (NaN included) when y is given; g is stored into a[i] and b[i], each
//   rounded once (RNE, NaN quieted: cpu_bf16_bits.h) into its own storage. A one-gradient call
//   passes the same output twice.
// - Storages: ElementStorage::fp32 (float) or ::bf16 (bf16 bits), for dy, y, a and b alike; y is
//   nullptr for the backward without the ReLU. fp16 and more than two gradients are the caller's
//   generic path (read_chunk / commit_chunk).
// - Aliasing: a (or b) may be dy itself in dy's storage (each element is read before it is
//   written); otherwise the outputs are disjoint from dy, y and each other.
// - The result is the generic chunked path's bit for bit (the same mask, the same rounding), on
//   any ISA and thread count: the loop is element-wise. OpenMP over blocks of elements with the
//   calling thread's team (parallel_worth); compiled for x86-64-v4, x86-64-v3 and the baseline,
//   cpuid picks one (cpu_isa.h).
#pragma once

#include <cstdint>

namespace mixtrain::backend_cpu {

enum class ElementStorage { fp32, bf16 };

struct ResidualGradientOut {
  void* data = nullptr;
  ElementStorage storage = ElementStorage::fp32;
};

void residual_backward_pair(const void* dy, ElementStorage dy_storage, const void* y,
                            ElementStorage y_storage, ResidualGradientOut a, ResidualGradientOut b,
                            std::int64_t n);

}  // namespace mixtrain::backend_cpu
