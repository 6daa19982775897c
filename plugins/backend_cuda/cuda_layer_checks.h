// Argument checks of the CUDA backend's convolution, pooling, permute and batch-norm ops, on the
// host before anything is enqueued. Plain C++ over TensorViews (their data is never read), so the
// host tests check every message without a GPU.
//
// Contract
// - Every check throws sdk::BackendError "backend_cuda.<op>: ..." naming the tensor, its dtype and
//   shape and what the geometry expects, with a hint (the CPU backend's wording where it has one).
// - Shapes: a 4-D view must match the geometry's dims exactly; any other view must hold the same
//   number of elements (activations are channels-last [N, H, W, C], weights [O, C/groups, KH, KW]).
// - Dtypes: convolution operands fp32, tf32, bf16 or fp16 (fp8 is not offered: supports() says no,
//   and a call names the dtype); outputs fp32, bf16 or fp16; dw, dbias, bias fp32. Pooling, the
//   permutes and batch norm take the storage floats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "mixtrain/sdk/backend_batch_norm.h"
#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::backend_cuda::layer_checks {

// Convolution operands this backend computes on (fp8 is narrowed out).
bool is_conv_operand(sdk::DType t);

void conv_geometry(std::string_view op, const sdk::Conv2dGeometry& g);
void conv_compute(std::string_view op, sdk::DType compute);
void conv_forward(const sdk::Conv2dForwardArgs& args);
void conv_backward_data(const sdk::Conv2dBackwardDataArgs& args);
void conv_backward_weights(const sdk::Conv2dBackwardWeightsArgs& args);

void pool_geometry(std::string_view op, const sdk::Pool2dGeometry& g);
// x [N, H, W, C] and y [N, OH, OW, C] of one storage dtype, not overlapping.
void pool_forward(const sdk::Pool2dGeometry& g, const sdk::TensorView& x, const sdk::TensorView& y,
                  const sdk::TensorView& workspace, std::size_t workspace_bytes);
void pool_backward(const sdk::Pool2dGeometry& g, const sdk::TensorView& dy,
                   const sdk::TensorView& x, const sdk::TensorView& workspace,
                   std::size_t workspace_bytes, const sdk::TensorView& dx);
// Returns the number of images.
std::int64_t permute(std::string_view op, const sdk::TensorView& src, std::int64_t channels,
                     std::int64_t height, std::int64_t width, const sdk::TensorView& dst);

void batchnorm_shape(std::string_view op, const sdk::BatchNormShape& s);
void batchnorm_forward(std::string_view op, const sdk::BatchNormShape& s, const sdk::TensorView& x,
                       const sdk::TensorView& y, const sdk::TensorView& gamma,
                       const sdk::TensorView& beta);
void channel_vector(std::string_view op, std::string_view name, const sdk::TensorView& v,
                    std::int64_t channels);
void batchnorm_workspace(std::string_view op, const sdk::TensorView& ws, std::size_t bytes);
// The backward's checks; returns whether the ReLU mask comes from the workspace (else from y).
bool batchnorm_backward(const sdk::TensorView& dy, const sdk::TensorView& x,
                        const sdk::TensorView& y, const sdk::TensorView& gamma,
                        const sdk::TensorView& save_mean, const sdk::TensorView& save_var,
                        const sdk::BatchNormShape& s, const sdk::TensorView& workspace,
                        std::size_t workspace_bytes, const sdk::TensorView& dx,
                        const sdk::TensorView& dgamma, const sdk::TensorView& dbeta);

}  // namespace mixtrain::backend_cuda::layer_checks
