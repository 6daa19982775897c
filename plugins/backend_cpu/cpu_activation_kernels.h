// The activation kernels: what the activation facet runs, and the GEMM facet's fused epilogue.
//
// Contract
// - apply_activation: y = act(x) element-wise; x and y are fp32 / bf16 / fp16 storage of equal
//   element counts (y may be x); math in fp32, one RNE rounding into y's dtype. GELU is the tanh
//   approximation, the same path at every size, so its numbers never depend on the tensor size.
// - apply_activation_grad: dx = dy · act'(x) with the same storage rules (ReLU: dy where x > 0,
//   else +0, NaN x included).
// - sum_columns: sums[n] (fp32) = (accumulate ? sums : 0) + Σ_rows x[rows, n], x fp32 / bf16 /
//   fp16 storage, summed in double per column (the bias gradient; the GEMM facet's gradient
//   epilogue sums with it too, so fused and unfused bias gradients are the same bits).
// - All set the calling thread's OpenMP team (context.use_threads()) and throw
//   sdk::BackendError naming the op and the offending tensor.
#pragma once

#include "cpu_context.h"
#include "mixtrain/sdk/backend_activation.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::backend_cpu {

void apply_activation(const CpuContext& context, sdk::Activation act, sdk::TensorView x,
                      sdk::TensorView y);
void apply_activation_grad(const CpuContext& context, sdk::Activation act, sdk::TensorView x,
                           sdk::TensorView dy, sdk::TensorView dx);
void sum_columns(const CpuContext& context, sdk::TensorView x, std::int64_t rows, std::int64_t n,
                 float* sums, bool accumulate);

}  // namespace mixtrain::backend_cpu
