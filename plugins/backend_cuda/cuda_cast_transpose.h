// Launcher of the FP8 cast-transpose kernel (cuda_cast_transpose.cu), the gemm facet's
// cast_transpose (sdk/backend_gemm.h 1.6). Contract: cuda_kernel_types.h's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

// src is [rows, cols] (f32, bf16 or f16); out (nullable) is [rows, cols] and out_t (nullable)
// [cols, rows], both of dst_t (e4m3 or e5m2): each code is cast()'s, encode(decode(src) * scale)
// (no multiply when scale is 1), written from one read of src. amax (nullable) folds in
// max|decode(src)| by cast()'s rule (NaN-aware).
cudaError_t cast_transpose(const void* src, Elem src_t, void* out, void* out_t, Elem dst_t,
                           std::int64_t rows, std::int64_t cols, float scale, bool saturate,
                           float* amax, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
