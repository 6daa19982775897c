// The weight gradient of a pointwise (1x1) convolution as one GEMM, where cpu_conv_algorithm.h's
// rule (CpuContext::pointwise_wgrad_as_gemm) takes it instead of oneDNN's convolution.
//
// Contract
// - args are the convolution facet's, already checked (conv2d_backward_weights), with a geometry
//   that pointwise_wgrad_shape() accepts and no fp8 dy when dbias is asked for.
// - dw fp32 [O, C, 1, 1] = (accumulate ? dw : 0) + dyᵀ [O, M] · x̂ [M, C], M = N·OH·OW, through
//   the backend's GemmEngine (cpu_gemm.h: its precision rules, which are the convolution's; fp8
//   scale_invs scale the product once; FP32 accumulation). dw is written in place: 1x1 OIHW is
//   row-major [O, C].
// - x̂ is x itself at stride 1; at a larger stride x's pixels at the stride, [N, OH, OW, C] in x's
//   dtype, copied as stored into `gathered`: pointwise_gather_bytes() bytes of the caller's
//   scratch (none at stride 1, where `gathered` is not read).
// - dbias fp32 [O] (when not empty) = (accumulate ? dbias : 0) + Σ_M dy, summed in double per
//   channel (sum_columns, cpu_activation_kernels.h: the activation facet's bias gradient).
// - Errors: sdk::BackendError from the GEMM engine.
#pragma once

#include <cstddef>

#include "cpu_context.h"
#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::backend_cpu {

// Bytes of x̂ the call gathers: 0 at stride 1.
std::size_t pointwise_gather_bytes(const sdk::Conv2dGeometry& g, sdk::DType x);

void pointwise_weight_gradient(CpuContext& context, const sdk::Conv2dBackwardWeightsArgs& args,
                               void* gathered);

}  // namespace mixtrain::backend_cpu
