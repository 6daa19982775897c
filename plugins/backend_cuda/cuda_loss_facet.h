// CudaLoss: the CUDA backend's LossFacet (sdk/backend_loss.h): softmax cross-entropy with label
// smoothing, a warp per row below 512 classes and a block per row from 512 (whole 16-byte packs of
// a row where the classes are a multiple of 8 and the views aligned: cuda_loss.cu), the
// log-sum-exp and the mean loss in double.
//
// Contract (in addition to sdk/backend_loss.h)
// - Labels are checked on the device without a host sync: an out-of-range label leaves loss,
//   correct and dlogits untouched and raises BackendError ("label 7 at row 3 is outside [0, 5)")
//   at the next synchronising call (CudaContext::sync).
#pragma once

#include "cuda_context.h"
#include "mixtrain/sdk/backend_loss.h"

namespace mixtrain::backend_cuda {

class CudaLoss final : public sdk::LossFacet {
 public:
  explicit CudaLoss(CudaContext& context) : context_(context) {}

  void softmax_cross_entropy(sdk::TensorView logits, sdk::TensorView labels, float grad_scale,
                             float label_smoothing, sdk::TensorView loss, sdk::TensorView correct,
                             sdk::TensorView dlogits) override;

 private:
  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
