// CudaBackend: the CUDA DeviceBackend. It is the required core (memory, copies, cast, fill,
// synchronize) over a CudaContext (cuda_context.h: device, stream, allocator, cuBLASLt engine,
// scratch) and owns one object per facet, each its own class over that context that registers
// itself from its own file (cuda_<facet>_facet.cpp or .cu; sdk/support/facet_registry.h), so the
// backend names none of them: GEMMs on Tensor Cores through cuBLASLt (cuda_gemm.h), convolutions
// through cuDNN's graph API (cuda_conv_plans.h; only when the build found cuDNN 9:
// MIXTRAIN_HAVE_CUDNN), every other op a CUDA kernel of this plugin (cuda_<facet>.cu).
//
// Contract (in addition to sdk/device_backend.h)
// - find_facet(name) answers from the facet objects the constructor made over the context, one
//   per registration linked into the module: gemm, activation,
//   gradient_check, foreach, layer_norm, batch_norm, convolution (cuDNN builds only), loss,
//   optimizer, residual, attention, embedding, dropout, step_graph (the host asks for it only
//   under run.step_graphs), native_stream (the one stream, for plugins that order their own
//   device work against it, e.g. the NCCL communicator), scratch and image_input. Each lives as
//   long as the backend.
// - Construction selects `device` and throws sdk::BackendError carrying CUDA's own error text when
//   there is no usable device (no driver, no GPU, index out of range). Nothing else is touched
//   then.
// - Memory: a caching allocator (cuda_allocator.h) over cudaMalloc; memory_stats() counts the
//   bytes callers asked for plus the backend's own device buffers (cuBLASLt workspace, grow-only
//   scratch), like the CPU backend counts its GEMM scratch.
// - One non-blocking stream per backend: every op is enqueued on it in call order. copy_from_host
//   returns once the host buffer has been read, without waiting for the stream (it is staged in
//   pinned memory, cuda_host_staging.h);
//   copy_to_host, unscale_and_check_finite, sum_of_squares and first_nonfinite synchronise, as does
//   synchronize().
// - Numerics follow the CPU reference (sdk/float_formats.h rounding rules; FP32 math, FP32 or
//   double reductions in a fixed order). GEMMs accumulate in FP32 on Tensor Cores, so they match
//   the CPU to the input format's rounding, not bit for bit.
// - softmax_cross_entropy validates labels on the device (no sync); a label outside [0, classes)
//   leaves loss/correct/dlogits untouched and raises BackendError at the next synchronising call.
//   gather / scatter_add check their ids the same way (their own record): an id outside [0, V)
//   leaves out / dtable untouched and raises at the next synchronising call, naming id and row.
// - Errors: sdk::BackendError naming "backend_cuda.<op>", the tensor, its dtype/shape, and a fix.
// - Threading: one host thread at a time; each call makes the backend's device current.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_backend_options.h"
#include "cuda_context.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cuda {

class CudaBackend final : public sdk::DeviceBackend {
 public:
  // The options (cuda_backend_options.h); the first form takes the defaults on `device`.
  explicit CudaBackend(int device = 0);
  explicit CudaBackend(const CudaOptions& options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  // Number of visible CUDA devices, or throws BackendError with CUDA's error text.
  static int device_count();
  // The options of component "cuda": `device`.
  static sdk::OptionSchema option_schema();

  int device() const noexcept { return context_.device; }
  int sm_version() const noexcept { return context_.sm; }  // 90 for sm_90
  std::size_t cached_gemm_plans() const noexcept;
  // GemmEngine::plan_report(): which cuBLASLt plans exist, usable or declined, and their runs.
  std::vector<std::string> gemm_plan_report() const;
#ifdef MIXTRAIN_HAVE_CUDNN
  // ConvPlans::report(): each cuDNN plan (key, engine and its notes, workspace, runs) or why it
  // was declined; empty before the first convolution.
  std::vector<std::string> conv_plan_report() const;
#endif

  sdk::BackendCapabilities capabilities() const override;

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr) noexcept override;
  sdk::MemoryStats memory_stats() const override;
  void copy_from_host(sdk::TensorView dst, const void* src) override;
  void copy_to_host(void* dst, sdk::TensorView src) override;
  void copy(sdk::TensorView dst, sdk::TensorView src) override;
  void synchronize() override;

  void cast(sdk::TensorView src, sdk::TensorView dst, const sdk::CastArgs& args = {}) override;
  void fill(sdk::TensorView x, float value) override;

  sdk::Facet* find_facet(std::string_view name) override;

 private:
  // First member: constructed before and destroyed after the facet objects made over it.
  CudaContext context_;
  sdk::FacetSet facets_;
};

}  // namespace mixtrain::backend_cuda
