// The CUDA backend's own argument checks of its convolution and pooling ops, on the host before
// anything is enqueued. Plain C++ over TensorViews (their data is never read), so the host tests
// check every message without a GPU.
//
// Contract
// - Each runs what this backend decides on top of the SDK's shared checks
//   (sdk::BackendArgumentChecks through checks(): geometry, the tensors' shapes against it,
//   overlaps, presence; the permutes and batch norm need nothing more and call them directly),
//   and throws sdk::BackendError "backend_cuda.<op>: ..." naming the tensor, its dtype and shape
//   with a hint.
// - Dtypes: convolution operands fp32, tf32, bf16 or fp16 (fp8 is not offered: supports() says no,
//   and a call names the dtype); outputs fp32, bf16 or fp16; compute fp32 or tf32.
// - Limits: an activation of a convolution holds at most 2^31 - 1 elements (cuDNN's engines index
//   with 32 bits); a pooling window, its strides and padding fit in 32 bits; a max-pooling
//   workspace holds the argmax the kernels keep.
#pragma once

#include <cstddef>
#include <string_view>

#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::backend_cuda::layer_checks {

// Convolution operands this backend computes on (fp8 is narrowed out).
bool is_conv_operand(sdk::DType t);

// The operands', output's and compute dtypes, then the shared checks, then the 2^31 limit.
void conv_forward(const sdk::Conv2dForwardArgs& args);
void conv_backward_data(const sdk::Conv2dBackwardDataArgs& args);
// The same, with the shared accumulate check (dx fp32) in place of the output's dtype check.
void conv_backward_data_accumulate(const sdk::Conv2dBackwardDataArgs& args);
void conv_backward_weights(const sdk::Conv2dBackwardWeightsArgs& args);
// conv2d_workspace_bytes' query, as the call it describes is checked: the shared query checks,
// then the operand, output and compute dtypes and the 2^31 limit.
void conv_workspace_query(const sdk::Conv2dWorkspaceQuery& q);

// The pooling kernels' 32-bit window, strides and padding.
void pool_limits(std::string_view op, const sdk::Pool2dGeometry& g);
// The shared checks, the limits, and a workspace (when given, max pooling) of workspace_bytes.
void pool_forward(const sdk::Pool2dGeometry& g, const sdk::TensorView& x, const sdk::TensorView& y,
                  const sdk::TensorView& workspace, std::size_t workspace_bytes);
void pool_backward(const sdk::Pool2dGeometry& g, const sdk::TensorView& dy,
                   const sdk::TensorView& x, const sdk::TensorView& workspace,
                   std::size_t workspace_bytes, const sdk::TensorView& dx);

}  // namespace mixtrain::backend_cuda::layer_checks
