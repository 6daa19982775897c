// CudaGradientCheck: the CUDA backend's GradientCheckFacet (sdk/backend_gradient_check.h):
// unscale and inf/NaN checks over a whole list of fp32 gradients in one multi-tensor launch, the
// sum of squares in double, the first non-finite tensor.
//
// Contract (in addition to sdk/backend_gradient_check.h)
// - Every method synchronises (its answer is read back to the host) and so raises any deferred
//   label or id error first.
// - The sum of squares has a fixed partition and order: bit-reproducible run to run.
#pragma once

#include <span>

#include "cuda_context.h"
#include "mixtrain/sdk/backend_gradient_check.h"

namespace mixtrain::backend_cuda {

class CudaGradientCheck final : public sdk::GradientCheckFacet {
 public:
  explicit CudaGradientCheck(CudaContext& context) : context_(context) {}

  bool unscale_and_check_finite(std::span<const sdk::TensorView> grads, float inv_scale) override;
  GradientCheck unscale_check_and_sum_squares(std::span<const sdk::TensorView> grads,
                                              float inv_scale) override;
  int first_nonfinite(std::span<const sdk::TensorView> tensors) override;
  // Σ x² in double over any storage dtypes (synchronises); what unscale_check_and_sum_squares
  // reports.
  double sum_of_squares(std::span<const sdk::TensorView> tensors);

 private:
  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
