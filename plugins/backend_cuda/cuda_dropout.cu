// The dropout facet's kernel: one grid-stride pass, the keep bit recomputed per element from the
// key and the element index (contract: cuda_dropout.h).
#include "cuda_device.cuh"
#include "cuda_dropout.h"

namespace mixtrain::backend_cuda::kernels {

namespace {

// in [n] in storage IS, out [n] in storage OS (in place when they are the same view).
template <class IS, class OS>
__global__ void __launch_bounds__(kThreads)
    dropout_kernel(const elem_t<IS>* in, elem_t<OS>* out, std::int64_t n, std::uint64_t state,
                   std::uint32_t threshold, float scale) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const bool keep = element::dropout_keeps_at(state, static_cast<std::uint64_t>(i), threshold);
    out[i] = OS::store(element::dropout_value(IS::load(in[i]), keep, scale), false);
  }
}

}  // namespace

cudaError_t dropout(const void* in, Elem it, void* out, Elem ot, std::int64_t n,
                    std::uint64_t state, std::uint32_t threshold, float scale,
                    cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  bool known = false;
  with_float_storage(it, [&](auto is) {
    known = with_float_storage(ot, [&](auto os) {
      using IS = decltype(is);
      using OS = decltype(os);
      dropout_kernel<IS, OS><<<grid_for(n), kThreads, 0, stream>>>(
          static_cast<const elem_t<IS>*>(in), static_cast<elem_t<OS>*>(out), n, state, threshold,
          scale);
    });
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace mixtrain::backend_cuda::kernels
