// CudaResidual: the CUDA backend's ResidualFacet (sdk/backend_residual.h, 1.1): y = Σ xs (then
// ReLU), summed in FP32 and rounded once into y, and its backward, dy masked where y is not
// positive and rounded once into every input's gradient, by cuda_residual.cu's kernels. No host
// sync and no allocation but the shared grow-only scratch (add with more than kResidualInputs
// inputs): legal while a step graph records.
#pragma once

#include <span>

#include "cuda_context.h"
#include "mixtrain/sdk/backend_residual.h"

namespace mixtrain::backend_cuda {

class CudaResidual final : public sdk::ResidualFacet {
 public:
  explicit CudaResidual(CudaContext& context) : context_(context) {}

  void add(std::span<const sdk::TensorView> xs, bool relu, sdk::TensorView y) override;
  // 1.1: every input's gradient from one read of dy (and y): cuda_residual.cu's backward kernel,
  // one launch per kResidualInputs gradients, the one that is dy itself (if any) in the last.
  void add_backward(sdk::TensorView dy, sdk::TensorView y, bool relu,
                    std::span<const sdk::TensorView> dxs) override;

 private:
  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
