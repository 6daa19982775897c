// Launchers of the FP8 cast-transpose kernel (cuda_cast_transpose.cu): the gemm facet's
// cast_transpose (sdk/backend_gemm.h 1.6) and cast_transpose_gradient (1.7). Contract:
// cuda_kernel_types.h's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
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

// Floats of scratch cast_transpose_gradient's column sums need for [rows, cols].
std::size_t cast_transpose_sum_scratch(std::int64_t rows, std::int64_t cols);

// cast_transpose of d instead of src: d = src, or with gelu_input (nullable, [rows, cols] of
// src_t) d = src · gelu'(gelu_input) rounded into src_t, as activation_backward writes it. The
// codes and amax are of d. column_sums (nullable, fp32 [cols]) (+)= Σ_rows d ("+=" when
// accumulate), in a fixed order: FP32 within each 64-row tile, then double across tiles in order;
// partial holds cast_transpose_sum_scratch(rows, cols) floats (needed only with column_sums).
cudaError_t cast_transpose_gradient(const void* src, const void* gelu_input, Elem src_t, void* out,
                                    void* out_t, Elem dst_t, std::int64_t rows, std::int64_t cols,
                                    float scale, bool saturate, float* amax, float* column_sums,
                                    bool accumulate, float* partial, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
