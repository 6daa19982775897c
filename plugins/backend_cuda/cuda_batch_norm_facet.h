// CudaBatchNorm: the CUDA backend's BatchNormFacet (sdk/backend_batch_norm.h, 1.2: synchronized
// batch norm's split ops and batch norm + add + ReLU): CUDA kernels (cuda_batch_norm.cu) with
// FP32 statistics and fixed-order reductions; always offered (it needs no cuDNN).
//
// Contract (in addition to sdk/backend_batch_norm.h)
// - Semantics as the CPU backend: save_var is the biased variance; the running variance moves
//   with the unbiased one (rows / (rows - 1)); the fused ReLU's backward recomputes the forward's
//   value from x with the forward's scale and shift (the workspace, 2·C floats) or masks where
//   y > 0; dgamma / dbeta written or accumulated.
// - batchnorm_add_forward: no host sync and no allocation beyond the shared grow-only scratch
//   (partial, partial2), like the other forwards, so a step graph may record it.
#pragma once

#include <cstddef>

#include "cuda_context.h"
#include "mixtrain/sdk/backend_batch_norm.h"

namespace mixtrain::backend_cuda {

class CudaBatchNorm final : public sdk::BatchNormFacet {
 public:
  explicit CudaBatchNorm(CudaContext& context) : context_(context) {}

  std::size_t batchnorm_workspace_bytes(const sdk::BatchNormShape& shape,
                                        sdk::DType x) const override;
  void batchnorm_forward_training(sdk::TensorView x, sdk::TensorView gamma, sdk::TensorView beta,
                                  const sdk::BatchNormShape& shape, float momentum,
                                  sdk::TensorView y, sdk::TensorView save_mean,
                                  sdk::TensorView save_var, sdk::TensorView running_mean,
                                  sdk::TensorView running_var, sdk::TensorView workspace) override;
  void batchnorm_forward_inference(sdk::TensorView x, sdk::TensorView gamma, sdk::TensorView beta,
                                   sdk::TensorView running_mean, sdk::TensorView running_var,
                                   const sdk::BatchNormShape& shape, sdk::TensorView y) override;
  void batchnorm_backward(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView y,
                          sdk::TensorView gamma, sdk::TensorView save_mean,
                          sdk::TensorView save_var, const sdk::BatchNormShape& shape,
                          sdk::TensorView workspace, sdk::TensorView dx, sdk::TensorView dgamma,
                          sdk::TensorView dbeta, bool accumulate) override;
  void batchnorm_statistics(sdk::TensorView x, const sdk::BatchNormShape& shape,
                            sdk::TensorView mean, sdk::TensorView var) override;
  void batchnorm_backward_reduce(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView y,
                                 sdk::TensorView mean, sdk::TensorView var,
                                 const sdk::BatchNormShape& shape, sdk::TensorView sum_dy,
                                 sdk::TensorView sum_dy_xhat) override;
  void batchnorm_backward_elementwise(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView y,
                                      sdk::TensorView gamma, sdk::TensorView mean,
                                      sdk::TensorView var, sdk::TensorView mean_dy,
                                      sdk::TensorView mean_dy_xhat,
                                      const sdk::BatchNormShape& shape,
                                      sdk::TensorView dx) override;
  // 1.2: batch norm + add + ReLU, the forward kernels with the residual read by the apply pass.
  void batchnorm_add_forward(const sdk::BatchNormAddArgs& args) override;

 private:
  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
