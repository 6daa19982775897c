// Launchers of the activation facet's kernels (cuda_activation.cu): relu / gelu forward and
// backward, axpy, and the bias gradient. Contract: cuda_kernel_types.h's (fp32 / bf16 / fp16, any
// mix); gelu and gelu' are cuda_element_math.h's, host-tested against the CPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_column_sums.h"
#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

cudaError_t axpy(float alpha, const void* x, Elem xt, float* y, std::int64_t n,
                 cudaStream_t stream);
// act: 0 relu, 1 gelu (tanh approximation).
cudaError_t activation_forward(int act, const void* x, Elem xt, void* y, Elem yt, std::int64_t n,
                               cudaStream_t stream);
cudaError_t activation_backward(int act, const void* x, Elem xt, const void* dy, Elem dyt, void* dx,
                                Elem dxt, std::int64_t n, cudaStream_t stream);
// Column sums of [rows, n] into out[n] (out = (accumulate ? out : 0) + sums). `partial` is scratch
// of column_sum_scratch(rows, n) floats (cuda_column_sums.h).
cudaError_t bias_grad(const void* dy, Elem dyt, float* dbias, std::int64_t rows, std::int64_t n,
                      bool accumulate, float* partial, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
