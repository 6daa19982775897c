// CudaBackend: the DeviceBackend core (capabilities, memory, copies, cast, fill, synchronize) on
// the context, and find_facet's table of the facet objects.
#include "cuda_backend.h"
#include "cuda_backend_options.h"

#include "cuda_access.h"
#include "cuda_cast_fill.h"
#include "cuda_gemm.h"
#ifdef MIXTRAIN_HAVE_CUDNN
#include "cuda_conv_plans.h"
#endif

namespace mixtrain::backend_cuda {

using sdk::DType;
using sdk::TensorView;

int CudaBackend::device_count() {
  return CudaContext::device_count();
}

sdk::OptionSchema CudaBackend::option_schema() {
  return cuda_backend_option_schema();
}

CudaBackend::CudaBackend(int device) : CudaBackend(CudaOptions{.device = device}) {}

CudaBackend::CudaBackend(const CudaOptions& options)
    : context_(options), facets_(sdk::make_facets(context_)) {}

CudaBackend::~CudaBackend() = default;

sdk::Facet* CudaBackend::find_facet(std::string_view name) {
  return facets_.find(name);
}

std::size_t CudaBackend::cached_gemm_plans() const noexcept {
  return context_.gemm->cached_plans();
}

std::vector<std::string> CudaBackend::gemm_plan_report() const {
  return context_.gemm->plan_report();
}

#ifdef MIXTRAIN_HAVE_CUDNN
std::vector<std::string> CudaBackend::conv_plan_report() const {
  return context_.conv ? context_.conv->plans.report() : std::vector<std::string>{};
}
#endif

sdk::BackendCapabilities CudaBackend::capabilities() const {
  return context_.capabilities();
}

// --- memory ------------------------------------------------------------------------------------

void* CudaBackend::allocate(std::size_t bytes) {
  context_.activate();
  return context_.allocator.allocate(bytes);
}

void CudaBackend::deallocate(void* ptr) noexcept {
  if (ptr == nullptr) return;
  context_.allocator.deallocate(ptr);  // not ours (or freed twice): ignored, never freed
}

sdk::MemoryStats CudaBackend::memory_stats() const {
  const CachingAllocator& a = context_.allocator;
  return {a.current(), a.peak(), a.live_count()};
}

void CudaBackend::copy_from_host(TensorView dst, const void* src) {
  context_.activate();
  require_present("copy_from_host", "dst", dst);
  context_.staging.copy(dst.data, src, dst.bytes(), context_.stream, "copy_from_host");
}

void CudaBackend::copy_to_host(void* dst, TensorView src) {
  context_.activate();
  require_present("copy_to_host", "src", src);
  if (src.bytes() != 0)
    check_cuda(cudaMemcpyAsync(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, context_.stream),
               "copy_to_host", "cudaMemcpyAsync");
  context_.sync("copy_to_host");
}

void CudaBackend::copy(TensorView dst, TensorView src) {
  context_.activate();
  checks().copy_args(dst, src);
  if (dst.bytes() != 0 && dst.data != src.data)
    check_cuda(
        cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, context_.stream),
        "copy", "cudaMemcpyAsync");
}

void CudaBackend::synchronize() {
  context_.activate();
  context_.sync("synchronize");
}

// --- cast and fill -----------------------------------------------------------------------------

void CudaBackend::cast(TensorView src, TensorView dst, const sdk::CastArgs& args) {
  context_.activate();
  checks().cast_args(src, dst, args);
  float* amax = args.amax.empty() ? nullptr : args.amax.as<float>();
  check_cuda(kernels::cast(src.data, elem_of(src.dtype), dst.data, elem_of(dst.dtype),
                           dst.dtype == DType::tf32, src.numel(), args.scale, args.saturate, amax,
                           context_.stream),
             "cast", "cast kernel launch");
}

void CudaBackend::fill(TensorView x, float value) {
  context_.activate();
  require_present("fill", "x", x);
  if (x.dtype != DType::int32) require_storage("fill", "x", x);
  check_cuda(kernels::fill(x.data, elem_of(x.dtype), x.numel(), value, context_.stream), "fill",
             "kernel launch");
}

}  // namespace mixtrain::backend_cuda
