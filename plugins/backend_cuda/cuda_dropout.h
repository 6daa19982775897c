// Launcher of the dropout facet's kernel (cuda_dropout.cu); plain C++ like every launcher header
// (cuda_kernel_types.h).
//
// Contract: enqueues on `stream` only, validates nothing (the backend did), returns the launch
// status. out[i] = dropout_value(in[i], dropout_keeps_at(state, i, threshold), scale)
// (cuda_element_math.h, the mask of sdk/backend_dropout.h bit for bit): element i's bit depends
// on the key and i alone, never on the launch shape.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

// state: element::dropout_state(key.seed, key.stream); threshold: sdk::dropout_threshold(p);
// scale: sdk::dropout_scale(p). out may be in (the same view); otherwise they do not overlap.
cudaError_t dropout(const void* in, Elem it, void* out, Elem ot, std::int64_t n,
                    std::uint64_t state, std::uint32_t threshold, float scale, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
