// Launchers of the GEMM engine's own kernels (cuda_gemm_kernels.cu): the scaling and transposes
// around cuBLASLt, and the bias add where cuBLASLt cannot fuse it (the convolution's fp32 output
// borrows it too). Contract: cuda_kernel_types.h's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

// x *= alpha in place (fp32 / bf16 / fp16).
cudaError_t scale(void* x, Elem t, std::int64_t n, float alpha, cudaStream_t stream);
// out[c, r] = in[r, c] for a [rows, cols] matrix of `elem_bytes`-byte elements.
cudaError_t transpose(const void* in, void* out, std::int64_t rows, std::int64_t cols,
                      int elem_bytes, cudaStream_t stream);
// y[rows, n] += bias[n] (the GEMM's bias epilogue where cuBLASLt cannot fuse it).
cudaError_t add_bias(void* y, Elem yt, const void* bias, Elem bt, std::int64_t rows, std::int64_t n,
                     cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
