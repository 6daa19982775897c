// CudaActivation: validation and launch of the activation, axpy and bias-gradient kernels.
#include "cuda_activation_facet.h"
#include "mixtrain/sdk/support/facet_registry.h"

#include <algorithm>
#include <cstddef>

#include "cuda_access.h"
#include "cuda_activation.h"

namespace mixtrain::backend_cuda {

using sdk::TensorView;

void CudaActivation::bias_grad(TensorView dy, TensorView dbias, bool accumulate) {
  context_.activate();
  const auto [rows, n] = checks().bias_grad_shape(dy, dbias);
  float* partial = context_.partial.as<float>(
      std::max<std::size_t>(1, kernels::column_sum_scratch(rows, n)), context_.stream, "bias_grad");
  context_.account_buffers();
  check_cuda(kernels::bias_grad(dy.data, elem_of(dy.dtype), dbias.as<float>(), rows, n, accumulate,
                                partial, context_.stream),
             "bias_grad", "kernel launch");
}

void CudaActivation::activation_forward(sdk::Activation act, TensorView x, TensorView y) {
  context_.activate();
  checks().activation_args(x, y);
  check_cuda(
      kernels::activation_forward(act == sdk::Activation::relu ? 0 : 1, x.data, elem_of(x.dtype),
                                  y.data, elem_of(y.dtype), x.numel(), context_.stream),
      "activation_forward", "kernel launch");
}

void CudaActivation::activation_backward(sdk::Activation act, TensorView x, TensorView dy,
                                         TensorView dx) {
  context_.activate();
  checks().activation_grad_args(x, dy, dx);
  check_cuda(kernels::activation_backward(act == sdk::Activation::relu ? 0 : 1, x.data,
                                          elem_of(x.dtype), dy.data, elem_of(dy.dtype), dx.data,
                                          elem_of(dx.dtype), x.numel(), context_.stream),
             "activation_backward", "kernel launch");
}

void CudaActivation::axpy(float alpha, TensorView x, TensorView y) {
  context_.activate();
  checks().axpy_args(x, y);
  check_cuda(
      kernels::axpy(alpha, x.data, elem_of(x.dtype), y.as<float>(), x.numel(), context_.stream),
      "axpy", "kernel launch");
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::ActivationFacet, CudaActivation> kCudaActivationRegistration;

}  // namespace mixtrain::backend_cuda
