// CudaActivation: the CUDA backend's ActivationFacet (sdk/backend_activation.h): relu / gelu
// (tanh) forward and backward, axpy, and the bias gradient, as kernels over any mix of the
// fp32 / bf16 / fp16 storage types.
//
// Contract (in addition to sdk/backend_activation.h)
// - Element math is cuda_element_math.h's, bit for bit the CPU backend's.
// - bias_grad is a column reduction with a fixed split of the rows (FP32 partials, double across
//   splits): bit-reproducible run to run.
#pragma once

#include "cuda_context.h"
#include "mixtrain/sdk/backend_activation.h"

namespace mixtrain::backend_cuda {

class CudaActivation final : public sdk::ActivationFacet {
 public:
  explicit CudaActivation(CudaContext& context) : context_(context) {}

  void bias_grad(sdk::TensorView dy, sdk::TensorView dbias, bool accumulate) override;
  void activation_forward(sdk::Activation act, sdk::TensorView x, sdk::TensorView y) override;
  void activation_backward(sdk::Activation act, sdk::TensorView x, sdk::TensorView dy,
                           sdk::TensorView dx) override;
  void axpy(float alpha, sdk::TensorView x, sdk::TensorView y) override;

 private:
  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
