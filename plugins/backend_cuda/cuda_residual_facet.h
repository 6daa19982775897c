// CudaResidual: the CUDA backend's ResidualFacet (sdk/backend_residual.h): y = Σ xs (then ReLU),
// summed in FP32 and rounded once into y, by cuda_residual.cu's kernel.
#pragma once

#include <span>

#include "cuda_context.h"
#include "mixtrain/sdk/backend_residual.h"

namespace mixtrain::backend_cuda {

class CudaResidual final : public sdk::ResidualFacet {
 public:
  explicit CudaResidual(CudaContext& context) : context_(context) {}

  void add(std::span<const sdk::TensorView> xs, bool relu, sdk::TensorView y) override;

 private:
  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
