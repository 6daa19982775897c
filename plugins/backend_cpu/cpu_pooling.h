// The convolution facet's pooling ops (cpu_pooling.cpp): the bodies of ConvolutionFacet's
// pool2d_workspace_bytes / pool2d_forward / pool2d_backward (sdk/backend_convolution.h) over
// channels-last activations.
//
// Contract
// - Max pooling: cpu_max_pool.h's loops (their index workspace; without one, the backward
//   recomputes the indices from x into the backend's scratch).
// - Average pooling: oneDNN, fp32 and bf16 natively, fp16 through fp32 scratch (exact decode, one
//   RNE encode), the batch whole, no workspace. Primitives are cached in context.prims().
// - Scratch growth is accounted (context.account_scratch()) before returning.
// - Errors: sdk::BackendError naming the op, as the facet's contract says.
#pragma once

#include "cpu_context.h"
#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::backend_cpu {

std::size_t pooling_workspace_bytes(const sdk::Pool2dGeometry& geometry, sdk::DType x);
void pooling_forward(CpuContext& context, const sdk::Pool2dGeometry& g, sdk::TensorView x,
                     sdk::TensorView y, sdk::TensorView workspace);
void pooling_backward(CpuContext& context, const sdk::Pool2dGeometry& g, sdk::TensorView dy,
                      sdk::TensorView x, sdk::TensorView y, sdk::TensorView workspace,
                      sdk::TensorView dx);

}  // namespace mixtrain::backend_cpu
