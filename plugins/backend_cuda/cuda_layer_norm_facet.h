// CudaLayerNorm: the CUDA backend's LayerNormFacet (sdk/backend_layer_norm.h): one warp per row,
// statistics in double (two-pass variance) as the CPU reference, dgamma / dbeta as reproducible
// reductions (a fixed partition of the rows, FP32 partials, double across them) summed in the
// backward's one row pass, or as column sums beside it (cuda_layer_norm_plan.h); 1.1's
// layernorm_backward_accumulate is the same row kernel adding into an fp32 dx; 1.2's
// layernorm_add_forward writes the residual sum and normalises it in one warp pass per row.
#pragma once

#include <span>

#include "cuda_context.h"
#include "mixtrain/sdk/backend_layer_norm.h"

namespace mixtrain::backend_cuda {

class CudaLayerNorm final : public sdk::LayerNormFacet {
 public:
  explicit CudaLayerNorm(CudaContext& context) : context_(context) {}

  void layernorm_forward(sdk::TensorView x, sdk::TensorView gamma, sdk::TensorView beta, float eps,
                         sdk::TensorView y, sdk::TensorView mean, sdk::TensorView rstd) override;
  void layernorm_backward(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView gamma,
                          sdk::TensorView mean, sdk::TensorView rstd, sdk::TensorView dx,
                          sdk::TensorView dgamma, sdk::TensorView dbeta, bool accumulate) override;
  void layernorm_backward_accumulate(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView gamma,
                                     sdk::TensorView mean, sdk::TensorView rstd, sdk::TensorView dx,
                                     sdk::TensorView dgamma, sdk::TensorView dbeta,
                                     bool accumulate) override;
  void layernorm_add_forward(const sdk::LayerNormAddArgs& args) override;
  // layernorm_backward_accumulate as layernorm_backward; layernorm_add_forward for any storage
  // floats {a, b, sum, y}; the rest as the SDK's table.
  bool supports(sdk::LayerNormOp op, std::span<const sdk::DType> dtypes) const override;

 private:
  void backward(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView gamma, sdk::TensorView mean,
                sdk::TensorView rstd, sdk::TensorView dx, sdk::TensorView dgamma,
                sdk::TensorView dbeta, bool accumulate, bool add_into_dx);
  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
