// CudaGradientCheck: the CUDA backend's GradientCheckFacet (sdk/backend_gradient_check.h):
// unscale and inf/NaN checks over a whole list of fp32 gradients in one multi-tensor launch, the
// sum of squares in double, the first non-finite tensor, the underflow tally.
//
// Contract (in addition to sdk/backend_gradient_check.h)
// - Every 1.0 method synchronises (its answer is read back to the host) and so raises any
//   deferred label or id error first.
// - queue_unscale_check waits for nothing: its kernels write the status on the stream, which is
//   copied into the facet's own pinned slot, and an event marks the copy. The status also carries
//   the label and id error records as they stand after the check (found_inf is set when either
//   holds an error, so a gated update skips); queued_check_result waits for the event only, and
//   raises such an error (after waiting for the stream) as the 1.0 methods do.
// - The sum of squares has a fixed partition and order: bit-reproducible run to run.
#pragma once

#include <span>

#include "cuda_context.h"
#include "cuda_gradient_check.h"
#include "mixtrain/sdk/backend_gradient_check.h"

namespace mixtrain::backend_cuda {

class CudaGradientCheck final : public sdk::GradientCheckFacet {
 public:
  explicit CudaGradientCheck(CudaContext& context) : context_(context) {}
  ~CudaGradientCheck() override;
  CudaGradientCheck(const CudaGradientCheck&) = delete;
  CudaGradientCheck& operator=(const CudaGradientCheck&) = delete;

  bool unscale_and_check_finite(std::span<const sdk::TensorView> grads, float inv_scale) override;
  GradientCheck unscale_check_and_sum_squares(std::span<const sdk::TensorView> grads,
                                              float inv_scale) override;
  int first_nonfinite(std::span<const sdk::TensorView> tensors) override;
  void queue_unscale_check(std::span<const sdk::TensorView> grads, float inv_scale,
                           bool sum_squares, sdk::TensorView status) override;
  GradientCheck queued_check_result() override;
  sdk::UnderflowTally count_underflow(sdk::TensorView values, float threshold) override;
  // Σ x² in double over any storage dtypes (synchronises); what unscale_check_and_sum_squares
  // reports.
  double sum_of_squares(std::span<const sdk::TensorView> tensors);

 private:
  CudaContext& context_;
  // The queued check's read back: pinned, apart from the context's shared result slot so that no
  // other call overwrites it before queued_check_result reads it. Made by the first queue.
  kernels::StatusRecord* pinned_status_ = nullptr;
  cudaEvent_t status_copied_ = nullptr;
  bool queued_ = false;
  bool queued_labels_ = false;  // the status carries the label / id error records
  bool queued_ids_ = false;
};

}  // namespace mixtrain::backend_cuda
