// CudaResidual: y = Σ xs (then ReLU), summed in FP32 and rounded once into y, and its backward,
// by cuda_residual.cu's kernels.
#include <algorithm>
#include <cstddef>

#include "cuda_access.h"
#include "cuda_residual.h"
#include "cuda_residual_facet.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cuda {

using sdk::TensorView;

void CudaResidual::add(std::span<const TensorView> xs, bool relu, TensorView y) {
  context_.activate();
  constexpr const char* op = "add";
  const std::int64_t n = checks().residual_add(xs, y);
  if (n == 0) return;
  // One launch takes kResidualInputs inputs. A longer list carries its running FP32 sum in
  // scratch from launch to launch: the same additions in the same order, and still the one
  // rounding into y, made by the last launch (the only one that writes y, so y may be any input).
  float* partial = nullptr;
  if (xs.size() > static_cast<std::size_t>(kernels::kResidualInputs)) {
    partial = context_.partial.as<float>(static_cast<std::size_t>(n), context_.stream, op);
    context_.account_buffers();
  }
  std::size_t next = 0;
  while (next < xs.size()) {
    kernels::ResidualInputs in{};
    if (next > 0) {
      in.data[0] = partial;
      in.type[0] = kernels::Elem::f32;
      in.count = 1;
    }
    while (next < xs.size() && in.count < kernels::kResidualInputs) {
      in.data[in.count] = xs[next].data;
      in.type[in.count] = elem_of(xs[next].dtype);
      ++in.count;
      ++next;
    }
    const bool last = next == xs.size();
    check_cuda(
        last ? kernels::residual_add(in, relu, y.data, elem_of(y.dtype), n, context_.stream)
             : kernels::residual_add(in, false, partial, kernels::Elem::f32, n, context_.stream),
        op, "kernel launch");
  }
}

void CudaResidual::add_backward(TensorView dy, TensorView y, bool relu,
                                std::span<const TensorView> dxs) {
  context_.activate();
  constexpr const char* op = "add_backward";
  const std::int64_t n = checks().residual_add_backward(dy, y, relu, dxs);
  if (n == 0) return;
  const kernels::Elem dyt = elem_of(dy.dtype);
  const kernels::Elem yt = relu ? elem_of(y.dtype) : kernels::Elem::f32;
  const void* y_data = relu ? y.data : nullptr;
  kernels::ResidualGrads out{};
  auto flush = [&] {
    if (out.count == 0) return;
    check_cuda(
        kernels::residual_add_backward(dy.data, dyt, y_data, yt, relu, out, n, context_.stream), op,
        "kernel launch");
    out = {};
  };
  auto take = [&](const TensorView& dx) {
    if (out.count == kernels::kResidualInputs) flush();
    out.data[out.count] = dx.data;
    out.type[out.count] = elem_of(dx.dtype);
    ++out.count;
  };
  // The gradient that is dy itself (the checks allow one) goes last: with more than one launch,
  // the earlier ones still read dy unmasked. Within a launch each thread reads an element before
  // it writes it.
  for (const TensorView& dx : dxs)
    if (!dx.empty() && dx.data != dy.data) take(dx);
  for (const TensorView& dx : dxs)
    if (!dx.empty() && dx.data == dy.data) take(dx);
  flush();
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::ResidualFacet, CudaResidual> kCudaResidualRegistration;

}  // namespace mixtrain::backend_cuda
