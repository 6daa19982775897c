// CudaBackend: the CUDA DeviceBackend. GEMMs run on Tensor Cores through cuBLASLt (cuda_gemm.h);
// convolutions through cuDNN's graph API (cuda_conv_plans.h; only when the build found cuDNN 9:
// MIXTRAIN_HAVE_CUDNN); every other op is a CUDA kernel of this plugin (cuda_kernels.cu,
// cuda_optimizers.cu, cuda_pooling.cu, cuda_batch_norm.cu, ...).
//
// Contract (in addition to sdk/device_backend.h)
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
// double
//   reductions in a fixed order). GEMMs accumulate in FP32 on Tensor Cores, so they match the CPU
//   to the input format's rounding, not bit for bit.
// - softmax_cross_entropy validates labels on the device (no sync); a label outside [0, classes)
//   leaves loss/correct/dlogits untouched and raises BackendError at the next synchronising call.
//   gather / scatter_add check their ids the same way (their own record): an id outside [0, V)
//   leaves out / dtable untouched and raises at the next synchronising call, naming id and row.
// - Errors: sdk::BackendError naming "backend_cuda.<op>", the tensor, its dtype/shape, and a fix.
// - Threading: one host thread at a time; each call makes the backend's device current.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_allocator.h"
#include "cuda_host_staging.h"
#include "cuda_kernels.h"
#include "cuda_scratch.h"
#include "mixtrain/sdk/backend_batch_norm.h"
#include "mixtrain/sdk/backend_convolution.h"
#include "mixtrain/sdk/backend_native_stream.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/facet_list.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain::backend_cuda {

class GemmEngine;  // cuda_gemm.h
struct ConvState;  // cuda_conv_plans.h

// The backend is its own facets: find_facet returns `this` as each of them (step_graph included:
// the host asks for it only under run.step_graphs; native_stream: the one stream, for plugins
// that order their own device work against it, e.g. the NCCL communicator). Residual, attention,
// embedding, dropout and batch norm have their own files (cuda_backend_<facet>.cpp, kernels in
// cuda_<facet>.cu); the convolution facet (conv2d through cuDNN, pooling and the permutes as
// kernels: cuda_backend_convolution.cpp) exists only in a build with cuDNN 9.
class CudaBackend final : public sdk::DeviceBackend,
                          public sdk::GemmFacet,
                          public sdk::ActivationFacet,
                          public sdk::GradientCheckFacet,
                          public sdk::ForeachFacet,
                          public sdk::LayerNormFacet,
                          public sdk::BatchNormFacet,
#ifdef MIXTRAIN_HAVE_CUDNN
                          public sdk::ConvolutionFacet,
#endif
                          public sdk::LossFacet,
                          public sdk::OptimizerFacet,
                          public sdk::ResidualFacet,
                          public sdk::AttentionFacet,
                          public sdk::EmbeddingFacet,
                          public sdk::DropoutFacet,
                          public sdk::StepGraphFacet,
                          public sdk::NativeStreamFacet {
 public:
  // fp8_fast_accumulation: CUBLASLT_MATMUL_DESC_FAST_ACCUM on native FP8 GEMMs (option of the
  // same name). gemm_autotune: GemmTuning::autotune_candidates (option of the same name; 0 or 1:
  // off).
  explicit CudaBackend(int device = 0, bool fp8_fast_accumulation = false, int gemm_autotune = 0);
  ~CudaBackend() override;

  // Number of visible CUDA devices, or throws BackendError with CUDA's error text.
  static int device_count();
  // The options of component "cuda": `device`.
  static sdk::OptionSchema option_schema();

  int device() const noexcept { return device_; }
  int sm_version() const noexcept { return sm_; }  // 90 for sm_90
  std::size_t cached_gemm_plans() const noexcept;
  // GemmEngine::plan_report(): which cuBLASLt plans exist, usable or declined, and their runs.
  std::vector<std::string> gemm_plan_report() const;

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

  // The SDK's table narrowed to the A/B dtypes capabilities() declares (FP8 only on sm_89+);
  // every other facet answers from the SDK's table as it is.
  bool supports(sdk::GemmOp op, std::span<const sdk::DType> dtypes) const override;

  void gemm(const sdk::GemmArgs& args) override;
  // One cuBLASLt strided-batched GEMM (GemmEngine::run_batched).
  void gemm_strided_batched(const sdk::GemmBatchedArgs& args) override;

  void bias_grad(sdk::TensorView dy, sdk::TensorView dbias, bool accumulate) override;
  void activation_forward(sdk::Activation act, sdk::TensorView x, sdk::TensorView y) override;
  void activation_backward(sdk::Activation act, sdk::TensorView x, sdk::TensorView dy,
                           sdk::TensorView dx) override;
  void layernorm_forward(sdk::TensorView x, sdk::TensorView gamma, sdk::TensorView beta, float eps,
                         sdk::TensorView y, sdk::TensorView mean, sdk::TensorView rstd) override;
  void layernorm_backward(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView gamma,
                          sdk::TensorView mean, sdk::TensorView rstd, sdk::TensorView dx,
                          sdk::TensorView dgamma, sdk::TensorView dbeta, bool accumulate) override;
  void softmax_cross_entropy(sdk::TensorView logits, sdk::TensorView labels, float grad_scale,
                             float label_smoothing, sdk::TensorView loss, sdk::TensorView correct,
                             sdk::TensorView dlogits) override;

  void axpy(float alpha, sdk::TensorView x, sdk::TensorView y) override;

  bool unscale_and_check_finite(std::span<const sdk::TensorView> grads, float inv_scale) override;
  // Σ x² in double (synchronises); what unscale_check_and_sum_squares reports.
  double sum_of_squares(std::span<const sdk::TensorView> tensors);
  GradientCheck unscale_check_and_sum_squares(std::span<const sdk::TensorView> grads,
                                              float inv_scale) override;
  int first_nonfinite(std::span<const sdk::TensorView> tensors) override;

  // One multi-tensor launch of cuda_foreach.cu's kernel for the whole list.
  void foreach_mul_scalar(std::span<const sdk::TensorView> self, float scalar) override;
  void foreach_mul(std::span<const sdk::TensorView> self,
                   std::span<const sdk::TensorView> other) override;
  void foreach_add_scalar(std::span<const sdk::TensorView> self, float scalar) override;
  void foreach_add(std::span<const sdk::TensorView> self, std::span<const sdk::TensorView> other,
                   float alpha = 1.0f) override;
  void foreach_addcmul(std::span<const sdk::TensorView> self, std::span<const sdk::TensorView> t1,
                       std::span<const sdk::TensorView> t2, float value = 1.0f) override;
  void foreach_sqrt(std::span<const sdk::TensorView> self) override;
  void foreach_sign(std::span<const sdk::TensorView> self) override;
  void foreach_lerp(std::span<const sdk::TensorView> self, std::span<const sdk::TensorView> end,
                    float weight) override;
  void foreach_clamp(std::span<const sdk::TensorView> self, float lo, float hi) override;

  void sgd_update(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> params) override;
  void adamw_update(const sdk::AdamWHyper& h, std::span<const sdk::ParamTensors> params) override;

  // --- ResidualFacet (cuda_backend_residual.cpp) ---------------------------------------------
  void add(std::span<const sdk::TensorView> xs, bool relu, sdk::TensorView y) override;

  // --- AttentionFacet (cuda_backend_attention.cpp) -------------------------------------------
  void split_heads(sdk::TensorView x, const sdk::HeadLayout& layout, sdk::TensorView y) override;
  void merge_heads(sdk::TensorView y, const sdk::HeadLayout& layout, sdk::TensorView x) override;
  void softmax_forward(sdk::TensorView scores, const sdk::SoftmaxShape& shape, float scale,
                       sdk::TensorView probs) override;
  void softmax_backward(sdk::TensorView probs, sdk::TensorView dprobs,
                        const sdk::SoftmaxShape& shape, float scale,
                        sdk::TensorView dscores) override;

  // --- EmbeddingFacet (cuda_backend_embedding.cpp) -------------------------------------------
  // Ids are checked on the device; a bad one raises at the next synchronising call.
  void gather(sdk::TensorView ids, sdk::TensorView table, sdk::TensorView out,
              bool accumulate) override;
  void scatter_add(sdk::TensorView ids, sdk::TensorView dy, sdk::TensorView dtable,
                   float beta) override;

  // --- DropoutFacet (cuda_backend_dropout.cpp) -----------------------------------------------
  void dropout_forward(sdk::TensorView x, sdk::TensorView y, float p, sdk::DropoutKey key) override;
  void dropout_backward(sdk::TensorView dy, sdk::TensorView dx, float p,
                        sdk::DropoutKey key) override;

  // Step graphs (cuda_step_graph.cpp): stream capture into a CUDA graph (thread-local mode), one
  // cudaGraphExec per id. While recording, host uploads raise BackendError (HostStaging), as do
  // waits and device allocations (CUDA refuses them in a capture; check_cuda raises).
  bool begin_capture() override;
  int end_capture() override;
  void replay(int graph) override;
  void release(int graph) noexcept override;

  // NativeStreamFacet: the cudaStream_t every op above is enqueued on.
  void* native_stream() override { return stream_; }

  // Batch norm (cuda_backend_batch_norm.cpp): FP32 statistics, fixed-order reductions.
  std::size_t batchnorm_workspace_bytes(const sdk::BatchNormShape& shape,
                                        sdk::DType x) const override;
  void batchnorm_forward_training(sdk::TensorView x, sdk::TensorView gamma, sdk::TensorView beta,
                                  const sdk::BatchNormShape& shape, float momentum,
                                  sdk::TensorView y, sdk::TensorView save_mean,
                                  sdk::TensorView save_var, sdk::TensorView running_mean,
                                  sdk::TensorView running_var, sdk::TensorView workspace) override;
  void batchnorm_forward_inference(sdk::TensorView x, sdk::TensorView gamma, sdk::TensorView beta,
                                   sdk::TensorView running_mean, sdk::TensorView running_var,
                                   const sdk::BatchNormShape& shape, sdk::TensorView y) override;
  void batchnorm_backward(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView y,
                          sdk::TensorView gamma, sdk::TensorView save_mean,
                          sdk::TensorView save_var, const sdk::BatchNormShape& shape,
                          sdk::TensorView workspace, sdk::TensorView dx, sdk::TensorView dgamma,
                          sdk::TensorView dbeta, bool accumulate) override;
  // Version 2: synchronized batch norm's split ops (contract in backend_batch_norm.h).
  void batchnorm_statistics(sdk::TensorView x, const sdk::BatchNormShape& shape,
                            sdk::TensorView mean, sdk::TensorView var) override;
  void batchnorm_backward_reduce(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView y,
                                 sdk::TensorView mean, sdk::TensorView var,
                                 const sdk::BatchNormShape& shape, sdk::TensorView sum_dy,
                                 sdk::TensorView sum_dy_xhat) override;
  void batchnorm_backward_elementwise(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView y,
                                      sdk::TensorView gamma, sdk::TensorView mean,
                                      sdk::TensorView var, sdk::TensorView mean_dy,
                                      sdk::TensorView mean_dy_xhat,
                                      const sdk::BatchNormShape& shape,
                                      sdk::TensorView dx) override;

#ifdef MIXTRAIN_HAVE_CUDNN
  // Convolution (cuda_backend_convolution.cpp): conv2d through cuDNN's graph API, pooling and the
  // permutes as kernels. supports() is the SDK's table without fp8 operands.
  bool supports(sdk::ConvolutionOp op, std::span<const sdk::DType> dtypes) const override;
  void conv2d_forward(const sdk::Conv2dForwardArgs& args) override;
  void conv2d_backward_data(const sdk::Conv2dBackwardDataArgs& args) override;
  void conv2d_backward_weights(const sdk::Conv2dBackwardWeightsArgs& args) override;
  std::size_t pool2d_workspace_bytes(const sdk::Pool2dGeometry& geometry,
                                     sdk::DType x) const override;
  void pool2d_forward(const sdk::Pool2dGeometry& geometry, sdk::TensorView x, sdk::TensorView y,
                      sdk::TensorView workspace) override;
  void pool2d_backward(const sdk::Pool2dGeometry& geometry, sdk::TensorView dy, sdk::TensorView x,
                       sdk::TensorView y, sdk::TensorView workspace, sdk::TensorView dx) override;
  void to_channels_last(sdk::TensorView src, std::int64_t channels, std::int64_t height,
                        std::int64_t width, sdk::TensorView dst) override;
  void to_channels_first(sdk::TensorView src, std::int64_t channels, std::int64_t height,
                         std::int64_t width, sdk::TensorView dst) override;
  // ConvPlans::report(): each cuDNN plan (key, engine and its notes, workspace, runs) or why it
  // was declined; empty before the first convolution.
  std::vector<std::string> conv_plan_report() const;
  // Folds the convolution's scratch growth into the memory statistics (account_buffers()).
  void account_conv_buffers();
#endif

 private:
  // Makes the backend's device current on this thread.
  void activate() const;
  void foreach_launch(const char* op, kernels::ForeachKind kind,
                      std::span<const sdk::TensorView> self, std::span<const sdk::TensorView> a,
                      std::span<const sdk::TensorView> b, float s0, float s1,
                      int lists);  // lists: how many of a, b the op reads
  // Waits for the stream, then raises any error a kernel left (bad labels) or a launch failure.
  void sync(const char* op);
  void check_deferred_errors();
  // Clears the label-error record on the stream (ordered before later kernels).
  void reset_error_record(const char* op);
  // The embedding ids' error record (device; allocated and cleared on first use), and the check
  // check_deferred_errors() runs: raises the first bad id found since the last one.
  kernels::ErrorRecord* id_record(const char* op);
  void check_id_errors();
  // Folds growth of the backend's own buffers into the memory statistics.
  void account_buffers();
  std::size_t conv_bytes() const;  // the convolution's scratch (0 before the first convolution)
  // Uploads the tensor and chunk tables of a multi-tensor op; returns the number of chunks.
  template <class Ref>
  int upload_tables(const std::vector<Ref>& refs, const std::vector<std::int64_t>& numels,
                    const Ref** dev_refs, const kernels::Chunk** dev_chunks, const char* op);
  template <class T>
  T* host_result(std::size_t count);
  // Checks `tensors` (fp32 only, or any storage float) and uploads their multi-tensor tables.
  struct TensorTables {
    const kernels::TensorRef* refs = nullptr;
    const kernels::Chunk* chunks = nullptr;
    int count = 0;
  };
  TensorTables tensor_tables(std::span<const sdk::TensorView> tensors, const char* op,
                             const char* name, bool fp32_only);
  // Enqueue the unscale/check kernel (returns the device flag) and the sum of squares (returns
  // the device result) over uploaded tables.
  int* enqueue_unscale(const TensorTables& t, float inv_scale, const char* op);
  double* enqueue_sum_of_squares(const TensorTables& t, const char* op);

  int device_ = 0;
  bool fp8_fast_accumulation_ = false;
  int gemm_autotune_ = 0;
  int sm_ = 0;
  int multiprocessors_ = 0;
  std::string name_;
  std::size_t total_memory_ = 0;
  cudaStream_t stream_ = nullptr;
  CachingAllocator allocator_;
  std::unique_ptr<GemmEngine> gemm_;
  DeviceScratch tables_, partial_, partial2_, flags_;
  HostStaging staging_;  // copy_from_host through pinned slots: no wait on the stream
  kernels::ErrorRecord* error_ = nullptr;  // device
  void* pinned_ = nullptr;                 // host, 4 KiB for results read back
  bool labels_pending_ = false;
  DeviceScratch id_check_;  // kernels::ErrorRecord of gather / scatter_add (cuda_embedding.h)
  bool ids_pending_ = false;
  std::size_t buffer_bytes_ = 0;  // own buffers already folded into the statistics
  std::vector<unsigned char> host_tables_;
  struct RecordedGraph {
    cudaGraphExec_t exec = nullptr;
    // It holds a label or id check: replaying arms that deferred error, as the calls did.
    bool checks_labels = false, checks_ids = false;
  };
  std::vector<RecordedGraph> graphs_;
  bool recording_ = false;
  // Graphs recorded and not released: while > 0 the scratch buffers keep every address a graph
  // holds (DeviceScratch::set_graph_guard), e.g. when an eval batch larger than the training one
  // grows partial_.
  int live_graphs_ = 0;

#ifdef MIXTRAIN_HAVE_CUDNN
  // Created by the first convolution (cuDNN's handle loads its engine libraries).
  ConvState& conv_state();
  std::unique_ptr<ConvState> conv_;
#endif
};

}  // namespace mixtrain::backend_cuda
