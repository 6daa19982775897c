// CudaResidual: y = Σ xs (then ReLU), summed in FP32 and rounded once into y, by
// cuda_residual.cu's kernel.
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

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::ResidualFacet, CudaResidual> kCudaResidualRegistration;

}  // namespace mixtrain::backend_cuda
