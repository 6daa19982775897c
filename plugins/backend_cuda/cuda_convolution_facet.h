// CudaConvolution: the CUDA backend's ConvolutionFacet (sdk/backend_convolution.h): conv2d
// forward / backward-data / backward-weights through cuDNN 9's graph API (cuda_conv_plans.h, a
// cached plan per shape), pooling and the channels-first / channels-last permutes as kernels
// (cuda_pooling.cu, cuda_conv_kernels.cu). Built only with cuDNN 9 (MIXTRAIN_HAVE_CUDNN).
//
// Contract (in addition to sdk/backend_convolution.h)
// - supports() is the SDK's table without fp8 operands (the CPU backend emulates fp8 exactly).
// - The cuDNN handle and plans live in the context, created by the first convolution.
// - A call no cuDNN plan serves raises BackendError naming each route's reason.
// - A caller's workspace (1.2) is used only when it holds the route's whole scratch; a plan built
//   for the query is the plan the call runs (the same key), so the bits are the same either way.
//   Two exceptions, both within one process's plan cache: with conv_autotune the call may time and
//   keep another candidate than the one the query sized (conv_autotune's option text), and a call
//   whose pointers are less aligned than the query assumed (16 bytes) runs another key's plan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "cuda_context.h"
#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::backend_cuda {

class CudaConvolution final : public sdk::ConvolutionFacet {
 public:
  explicit CudaConvolution(CudaContext& context) : context_(context) {}

  bool supports(sdk::ConvolutionOp op, std::span<const sdk::DType> dtypes) const override;
  void conv2d_forward(const sdk::Conv2dForwardArgs& args) override;
  void conv2d_backward_data(const sdk::Conv2dBackwardDataArgs& args) override;
  // dx += the data gradient (convolution facet 1.1): into an fp32 sum, or a 16-bit sum of dy's
  // dtype rounded once; offered while the option conv_dgrad_accumulate is on.
  void conv2d_backward_data_accumulate(const sdk::Conv2dBackwardDataArgs& args) override;
  void conv2d_backward_weights(const sdk::Conv2dBackwardWeightsArgs& args) override;
  // 1.2: cuDNN's workspace and every scratch of the call's route (decoded operands, channels-last
  // weights, the output before its finish: conv::route_scratch) from the caller's workspace when
  // it holds all of them; the first route cuDNN has a plan for sizes the answer (building and
  // caching that plan). For an accumulating dgrad that is the beta = 1 route; should cuDNN refuse
  // to run that plan, a scratch-and-add route after it takes all its scratch (cuDNN's workspace,
  // channels-last weights, the output before the add) from the backend's own buffers (grown once,
  // counted in its buffers), not from the caller's: the query sized only the first route.
  // With conv_autotune, a call in a caller's workspace times only the candidates whose workspace
  // fits in the first one's (the arena's bytes are planned, not grown). A pointwise accumulate
  // (one cuBLASLt GEMM) wants none.
  std::size_t conv2d_workspace_bytes(const sdk::Conv2dWorkspaceQuery& query) const override;
  void conv2d_forward_with_workspace(const sdk::Conv2dForwardArgs& args,
                                     sdk::TensorView workspace) override;
  void conv2d_backward_data_with_workspace(const sdk::Conv2dBackwardDataArgs& args,
                                           sdk::TensorView workspace) override;
  void conv2d_backward_data_accumulate_with_workspace(const sdk::Conv2dBackwardDataArgs& args,
                                                      sdk::TensorView workspace) override;
  void conv2d_backward_weights_with_workspace(const sdk::Conv2dBackwardWeightsArgs& args,
                                              sdk::TensorView workspace) override;
  std::size_t pool2d_workspace_bytes(const sdk::Pool2dGeometry& geometry,
                                     sdk::DType x) const override;
  void pool2d_forward(const sdk::Pool2dGeometry& geometry, sdk::TensorView x, sdk::TensorView y,
                      sdk::TensorView workspace) override;
  void pool2d_backward(const sdk::Pool2dGeometry& geometry, sdk::TensorView dy, sdk::TensorView x,
                       sdk::TensorView y, sdk::TensorView workspace, sdk::TensorView dx) override;
  void to_channels_last(sdk::TensorView src, std::int64_t channels, std::int64_t height,
                        std::int64_t width, sdk::TensorView dst) override;
  void to_channels_first(sdk::TensorView src, std::int64_t channels, std::int64_t height,
                         std::int64_t width, sdk::TensorView dst) override;

 private:
  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
