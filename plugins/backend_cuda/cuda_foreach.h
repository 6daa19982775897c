// Launchers of the foreach facet's multi-tensor kernel (cuda_foreach.cu). Contract:
// cuda_kernel_types.h's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

// Foreach ops (ForeachFacet), in place on fp32 tensors, as one multi-tensor launch
// (cuda_foreach.cu): one block per chunk of the table, every tensor of the lists in the same
// launch. ForeachRef i holds self[i] and, where the op reads them, the other lists' i-th tensors
// (a, b: nullptr otherwise); s0, s1: the op's scalars (mul_scalar/add_scalar: s0; add: alpha;
// addcmul: value; lerp: weight; clamp: lo, hi). NaN propagates through every op.
enum class ForeachKind { mul, add_scalar, add, addcmul, sqrt, sign, lerp, clamp };
struct ForeachRef {
  float* x;
  const float* a;  // nullable
  const float* b;  // nullable
  std::int64_t numel;
};
cudaError_t foreach_op(ForeachKind kind, const ForeachRef* tensors, const Chunk* chunks,
                       int num_chunks, float s0, float s1, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
