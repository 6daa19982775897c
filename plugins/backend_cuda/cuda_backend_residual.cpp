// CudaBackend's ResidualFacet: y = Σ xs (then ReLU), summed in FP32 and rounded once into y, by
// cuda_residual.cu's kernel.
#include <algorithm>
#include <cstddef>

#include "cuda_access.h"
#include "cuda_backend.h"
#include "cuda_residual.h"

namespace mixtrain::backend_cuda {

using sdk::TensorView;

void CudaBackend::add(std::span<const TensorView> xs, bool relu, TensorView y) {
  activate();
  constexpr const char* op = "add";
  const std::int64_t n = checks().residual_add(xs, y);
  if (n == 0) return;
  // One launch takes kResidualInputs inputs. A longer list carries its running FP32 sum in
  // scratch from launch to launch: the same additions in the same order, and still the one
  // rounding into y, made by the last launch (the only one that writes y, so y may be any input).
  float* partial = nullptr;
  if (xs.size() > static_cast<std::size_t>(kernels::kResidualInputs)) {
    partial = partial_.as<float>(static_cast<std::size_t>(n), stream_, op);
    account_buffers();
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
    check_cuda(last ? kernels::residual_add(in, relu, y.data, elem_of(y.dtype), n, stream_)
                    : kernels::residual_add(in, false, partial, kernels::Elem::f32, n, stream_),
               op, "kernel launch");
  }
}

}  // namespace mixtrain::backend_cuda
