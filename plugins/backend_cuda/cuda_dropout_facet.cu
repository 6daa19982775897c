// CudaDropout: the CUDA backend's DropoutFacet (sdk/backend_dropout.h), whole in one file: the
// facet object over the shared CudaContext, its kernel and its registration.
//
// Contract (in addition to sdk/backend_dropout.h)
// - Element i's keep bit is the SDK's own sdk::dropout_keeps compiled for the device (nvcc's
//   --expt-relaxed-constexpr, set for the target), so the CPU and the GPU draw one mask bit for
//   bit by construction, whatever the launch shape; threshold and scale are the SDK's, evaluated
//   on the host. The value rule is cuda_element_math.h's dropout_value (host-tested against the
//   CPU backend).
// - Forward and backward are the same pass over different tensors: no mask is stored.
// - Enqueues on the context's stream and returns; arguments are checked by the SDK's shared
//   checks first (a BackendError names the op, the tensor and its dtype/shape).
#include "cuda_access.h"
#include "cuda_context.h"
#include "cuda_device.cuh"
#include "mixtrain/sdk/backend_dropout.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cuda {

namespace {

using sdk::TensorView;
using kernels::elem_t;

// in is [n] in storage IS, out is [n] in storage OS (in place when they are the same view).
template <class IS, class OS>
__global__ void __launch_bounds__(kernels::kThreads)
    dropout_kernel(const elem_t<IS>* in, elem_t<OS>* out, std::int64_t n, sdk::DropoutKey key,
                   std::uint32_t threshold, float scale) {
  for (std::int64_t i = kernels::global_thread(); i < n; i += kernels::grid_threads()) {
    const bool keep = sdk::dropout_keeps(key, static_cast<std::uint64_t>(i), threshold);
    out[i] = OS::store(element::dropout_value(IS::load(in[i]), keep, scale), false);
  }
}

// out[i] = keeps(key, i) ? in[i] * scale(p) : +0, launched over every element.
void apply_mask(const char* op, const TensorView& in, const TensorView& out, float p,
                sdk::DropoutKey key, cudaStream_t stream) {
  const std::int64_t n = in.numel();
  if (n == 0) return;
  bool known = false;
  kernels::with_float_storage(elem_of(in.dtype), [&](auto is) {
    known = kernels::with_float_storage(elem_of(out.dtype), [&](auto os) {
      using IS = decltype(is);
      using OS = decltype(os);
      dropout_kernel<IS, OS><<<kernels::grid_for(n), kernels::kThreads, 0, stream>>>(
          static_cast<const elem_t<IS>*>(in.data), static_cast<elem_t<OS>*>(out.data), n, key,
          sdk::dropout_threshold(p), sdk::dropout_scale(p));
    });
  });
  check_cuda(known ? cudaGetLastError() : cudaErrorInvalidValue, op, "kernel launch");
}

class CudaDropout final : public sdk::DropoutFacet {
 public:
  explicit CudaDropout(CudaContext& context) : context_(context) {}

  void dropout_forward(TensorView x, TensorView y, float p, sdk::DropoutKey key) override {
    context_.activate();
    checks().dropout("dropout_forward", "x", x, "y", y, p);
    apply_mask("dropout_forward", x, y, p, key, context_.stream);
  }
  // The forward's mask (same key and p) applied to dy.
  void dropout_backward(TensorView dy, TensorView dx, float p, sdk::DropoutKey key) override {
    context_.activate();
    checks().dropout("dropout_backward", "dy", dy, "dx", dx, p);
    apply_mask("dropout_backward", dy, dx, p, key, context_.stream);
  }

 private:
  CudaContext& context_;
};

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::DropoutFacet, CudaDropout> kCudaDropoutRegistration;

}  // namespace

}  // namespace mixtrain::backend_cuda
