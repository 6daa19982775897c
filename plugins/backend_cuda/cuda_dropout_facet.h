// CudaDropout: the CUDA backend's DropoutFacet (sdk/backend_dropout.h): the SDK's mask
// recomputed per element on the device (cuda_dropout.cu); forward and backward are the same pass
// over different tensors, so no mask is stored.
#pragma once

#include "cuda_context.h"
#include "mixtrain/sdk/backend_dropout.h"

namespace mixtrain::backend_cuda {

class CudaDropout final : public sdk::DropoutFacet {
 public:
  explicit CudaDropout(CudaContext& context) : context_(context) {}

  void dropout_forward(sdk::TensorView x, sdk::TensorView y, float p, sdk::DropoutKey key) override;
  void dropout_backward(sdk::TensorView dy, sdk::TensorView dx, float p,
                        sdk::DropoutKey key) override;

 private:
  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
