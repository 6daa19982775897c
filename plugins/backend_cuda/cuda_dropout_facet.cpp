// CudaDropout: sdk/backend_dropout.h's mask recomputed per element on the device
// (cuda_dropout.cu); forward and backward are the same pass over different tensors.
#include "cuda_dropout_facet.h"
#include "cuda_access.h"
#include "cuda_dropout.h"
#include "cuda_element_math.h"

namespace mixtrain::backend_cuda {

using sdk::TensorView;

namespace {

void apply_mask(const char* op, const TensorView& in, const TensorView& out, float p,
                sdk::DropoutKey key, cudaStream_t stream) {
  // threshold and scale are the SDK's own functions, evaluated here on the host; the per-element
  // bits come from cuda_element_math.h's mirror of sdk::dropout_keeps (host-tested against it).
  check_cuda(kernels::dropout(in.data, elem_of(in.dtype), out.data, elem_of(out.dtype), in.numel(),
                              element::dropout_state(key.seed, key.stream),
                              sdk::dropout_threshold(p), sdk::dropout_scale(p), stream),
             op, "kernel launch");
}

}  // namespace

void CudaDropout::dropout_forward(TensorView x, TensorView y, float p, sdk::DropoutKey key) {
  context_.activate();
  checks().dropout("dropout_forward", "x", x, "y", y, p);
  apply_mask("dropout_forward", x, y, p, key, context_.stream);
}

void CudaDropout::dropout_backward(TensorView dy, TensorView dx, float p, sdk::DropoutKey key) {
  context_.activate();
  checks().dropout("dropout_backward", "dy", dy, "dx", dx, p);
  apply_mask("dropout_backward", dy, dx, p, key, context_.stream);
}

}  // namespace mixtrain::backend_cuda
