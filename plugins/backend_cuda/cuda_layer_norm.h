// Launchers of the layer norm facet's kernels (cuda_layer_norm.cu): one warp per row, statistics
// in double (two-pass variance) as the CPU reference; dgamma / dbeta summed in the row pass or
// through the reproducible column sums (cuda_layer_norm_plan.h, cuda_column_sums.h). A lane loads
// several of its columns before it works through them in column order: the same bits as one
// column at a time. Contract: cuda_kernel_types.h's (every tag fp32, bf16 or fp16).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_column_sums.h"
#include "cuda_kernel_types.h"
#include "cuda_layer_norm_plan.h"

namespace mixtrain::backend_cuda::kernels {

cudaError_t layernorm_forward(const void* x, Elem xt, const void* gamma, Elem gt, const void* beta,
                              Elem bt, float eps, void* y, Elem yt, float* mean, float* rstd,
                              std::int64_t rows, std::int64_t n, cudaStream_t stream);
// sum = a + b (FP32, rounded once into st; sum may be a or b), then layernorm_forward of the sum
// as stored (layer norm 1.2).
cudaError_t layernorm_add_forward(const void* a, Elem at, const void* b, Elem bt_in, void* sum,
                                  Elem st, const void* gamma, Elem gt, const void* beta, Elem bt,
                                  float eps, void* y, Elem yt, float* mean, float* rstd,
                                  std::int64_t rows, std::int64_t n, cudaStream_t stream);
// dgamma/dbeta nullable, and both null exactly when route is rows_only; partial: the route's
// scratch, 2 * column_sum_scratch(rows, n) floats for column_sums_then_rows,
// one_pass_scratch_floats(rows, n) for one_pass (whose shared memory the route checked fits).
// add_into_dx: dx is an fp32 sum apart from dy and x, and each element's gradient is added to it
// (layer norm 1.1).
cudaError_t layernorm_backward(const void* dy, Elem dyt, const void* x, Elem xt, const void* gamma,
                               Elem gt, const float* mean, const float* rstd, void* dx, Elem dxt,
                               float* dgamma, float* dbeta, bool accumulate, std::int64_t rows,
                               std::int64_t n, float* partial, cudaStream_t stream,
                               bool add_into_dx, layer_norm_plan::BackwardRoute route);

}  // namespace mixtrain::backend_cuda::kernels
