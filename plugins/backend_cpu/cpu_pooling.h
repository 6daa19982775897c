// The convolution facet's pooling ops on oneDNN (cpu_pooling.cpp): the bodies of
// ConvolutionFacet's pool2d_workspace_bytes / pool2d_forward / pool2d_backward
// (sdk/backend_convolution.h) over channels-last activations.
//
// Contract
// - fp32 and bf16 run natively in oneDNN; fp16 through fp32 scratch (exact decode, one RNE
//   encode), max pooling a chunk of whole images at a time (about 1 MiB of decoded source; the
//   same bits as the whole batch), average pooling whole. Primitives are cached in
//   context.prims(); scratch growth is accounted (context.account_scratch()) before returning.
// - Errors: sdk::BackendError naming the op, as the facet's contract says.
#pragma once

#include "cpu_context.h"
#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::backend_cpu {

std::size_t pooling_workspace_bytes(CpuContext& context, const sdk::Pool2dGeometry& geometry,
                                    sdk::DType x);
void pooling_forward(CpuContext& context, const sdk::Pool2dGeometry& g, sdk::TensorView x,
                     sdk::TensorView y, sdk::TensorView workspace);
void pooling_backward(CpuContext& context, const sdk::Pool2dGeometry& g, sdk::TensorView dy,
                      sdk::TensorView x, sdk::TensorView y, sdk::TensorView workspace,
                      sdk::TensorView dx);

}  // namespace mixtrain::backend_cpu
