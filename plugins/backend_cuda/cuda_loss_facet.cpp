// CudaLoss: validation and launch of the softmax cross-entropy kernels; the label check's
// record is the context's.
#include "cuda_loss_facet.h"
#include "mixtrain/sdk/support/facet_registry.h"

#include <climits>
#include <cstdint>

#include "cuda_access.h"
#include "cuda_loss.h"

namespace mixtrain::backend_cuda {

using sdk::TensorView;

void CudaLoss::softmax_cross_entropy(TensorView logits, TensorView labels, float grad_scale,
                                     float label_smoothing, TensorView loss, TensorView correct,
                                     TensorView dlogits) {
  context_.activate();
  constexpr const char* op = "softmax_cross_entropy";
  const auto [rows, classes] =
      checks().softmax_cross_entropy_shape(logits, labels, label_smoothing, loss, correct, dlogits);
  if (rows > INT32_MAX || classes > INT32_MAX)
    fail(op, "logits " + describe(logits) + " is too large for the kernel's 32-bit row index",
         "split the batch");
  auto* row_loss = context_.partial.as<double>(static_cast<std::size_t>(rows), context_.stream, op);
  auto* row_ok = context_.partial2.as<int>(static_cast<std::size_t>(rows), context_.stream, op);
  context_.account_buffers();
  check_cuda(
      kernels::softmax_cross_entropy(
          logits.data, elem_of(logits.dtype), labels.as<const std::int32_t>(), grad_scale,
          label_smoothing, loss.as<float>(), correct.empty() ? nullptr : correct.as<std::int32_t>(),
          dlogits.empty() ? nullptr : dlogits.data, elem_of(dlogits.dtype), rows, classes, row_loss,
          row_ok, context_.next_check_code(), context_.label_record, context_.stream),
      op, "kernel launch");
  context_.labels_pending = true;
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::LossFacet, CudaLoss> kCudaLossRegistration;

}  // namespace mixtrain::backend_cuda
