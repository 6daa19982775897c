// CudaBackend: construction, capabilities, memory, copies, validation and dispatch of every op to
// its kernel (cuda_kernels.cu, cuda_optimizers.cu) or to cuBLASLt (cuda_gemm.cpp).
#include "cuda_backend.h"
#include "cuda_backend_options.h"

#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "cuda_access.h"
#include "cuda_gemm.h"
#ifdef MIXTRAIN_HAVE_CUDNN
#include "cuda_conv_plans.h"
#endif

namespace mixtrain::backend_cuda {

using kernels::Elem;
using sdk::DType;
using sdk::TensorView;

namespace {

constexpr std::size_t kPinnedBytes = 4096;

const char* kNoDeviceHint =
    "run on a machine with an NVIDIA GPU and its driver (nvidia-smi lists it), check "
    "CUDA_VISIBLE_DEVICES, or run on the CPU backend (backend.type = \"cpu\"; on the command "
    "line --set backend.type=cpu)";

const void* ptr_or_null(const TensorView& v) {
  return v.empty() ? nullptr : v.data;
}

}  // namespace

int CudaBackend::device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw sdk::BackendError("backend_cuda: no usable CUDA device: cudaGetDeviceCount failed: " +
                                cuda_error_text(status),
                            kNoDeviceHint);
  }
  if (count == 0)
    throw sdk::BackendError(
        "backend_cuda: no usable CUDA device: cudaGetDeviceCount reports 0 devices", kNoDeviceHint);
  return count;
}

sdk::OptionSchema CudaBackend::option_schema() {
  return cuda_backend_option_schema();
}

CudaBackend::CudaBackend(int device, bool fp8_fast_accumulation, int gemm_autotune)
    : device_(device),
      fp8_fast_accumulation_(fp8_fast_accumulation),
      gemm_autotune_(gemm_autotune) {
  if (device < 0)
    fail("create", "device = " + std::to_string(device) + " is negative",
         "use a device index >= 0 (0 is the first GPU)");
  const int count = device_count();
  if (device >= count)
    fail("create",
         "device = " + std::to_string(device) + " but " + std::to_string(count) +
             " CUDA device(s) are visible (" + cuda_error_text(cudaErrorInvalidDevice) + ")",
         "use a device index in [0, " + std::to_string(count) + ") or check CUDA_VISIBLE_DEVICES");
  check_cuda(cudaSetDevice(device), "create", "cudaSetDevice(" + std::to_string(device) + ")");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "create", "cudaGetDeviceProperties");
  sm_ = prop.major * 10 + prop.minor;
  name_ = prop.name;
  total_memory_ = prop.totalGlobalMem;
  multiprocessors_ = prop.multiProcessorCount;
  try {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "create",
               "cudaStreamCreateWithFlags");
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&error_), sizeof(kernels::ErrorRecord)),
               "create", "cudaMalloc of the error record");
    check_cuda(cudaMallocHost(&pinned_, kPinnedBytes), "create", "cudaMallocHost");
    reset_error_record("create");
    // A first launch tells whether this build has machine code (or PTX) for the device.
    const cudaError_t launch = kernels::fill(&error_->classes, Elem::i32, 1, 0.0f, stream_);
    const cudaError_t done = launch == cudaSuccess ? cudaStreamSynchronize(stream_) : launch;
    if (done != cudaSuccess) {
      (void)cudaGetLastError();
      fail("create",
           "cannot run kernels on device " + std::to_string(device) + " (" + name_ + ", sm_" +
               std::to_string(sm_) + "): " + cuda_error_text(done),
           "rebuild with CMAKE_CUDA_ARCHITECTURES including " + std::to_string(sm_) +
               " (this build targets sm_80 and sm_90 with compute_90 PTX by default)");
    }
    GemmTuning tuning;
    tuning.autotune_candidates = gemm_autotune_;
    gemm_ = std::make_unique<GemmEngine>(sm_, stream_, fp8_fast_accumulation_, tuning);
    // Scratch that cannot grow first takes back what the allocator caches; the stream is
    // synchronised first because cached blocks may still be read by enqueued work.
    auto give_back_cache = [this] {
      cudaStreamSynchronize(stream_);
      allocator_.release_cached();
    };
    gemm_->set_out_of_memory_hook(give_back_cache);
    gemm_->set_graph_guard(&live_graphs_);
    for (DeviceScratch* s : {&tables_, &partial_, &partial2_, &flags_})
      s->set_out_of_memory_hook(give_back_cache);
    for (DeviceScratch* s : {&tables_, &partial_, &partial2_, &flags_, &id_check_})
      s->set_graph_guard(&live_graphs_);
  } catch (...) {
    gemm_.reset();
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
    if (error_ != nullptr) cudaFree(error_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    pinned_ = nullptr;
    error_ = nullptr;
    stream_ = nullptr;
    throw;
  }
  account_buffers();
}

CudaBackend::~CudaBackend() {
  activate();
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (auto& g : graphs_)
    if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
  staging_.release();
#ifdef MIXTRAIN_HAVE_CUDNN
  conv_.reset();
#endif
  gemm_.reset();
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  if (error_ != nullptr) cudaFree(error_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void CudaBackend::activate() const {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device_) cudaSetDevice(device_);
}

std::size_t CudaBackend::cached_gemm_plans() const noexcept {
  return gemm_->cached_plans();
}

std::vector<std::string> CudaBackend::gemm_plan_report() const {
  return gemm_->plan_report();
}

std::size_t CudaBackend::conv_bytes() const {
#ifdef MIXTRAIN_HAVE_CUDNN
  if (conv_) return conv_->device_bytes();
#endif
  return 0;
}

void CudaBackend::account_buffers() {
  // The fixed cuBLASLt workspace is not counted (like a library's own handle state); grow-only
  // scratch is, as the CPU backend counts its GEMM scratch.
  const std::size_t now = gemm_->device_bytes() - gemm_->workspace_bytes() + tables_.capacity() +
                          partial_.capacity() + partial2_.capacity() + flags_.capacity() +
                          conv_bytes();
  if (now == buffer_bytes_) return;
  allocator_.account_external(static_cast<std::ptrdiff_t>(now) -
                              static_cast<std::ptrdiff_t>(buffer_bytes_));
  buffer_bytes_ = now;
}

void CudaBackend::sync(const char* op) {
  check_cuda(cudaStreamSynchronize(stream_), op, "cudaStreamSynchronize");
  check_deferred_errors();
}

void CudaBackend::reset_error_record(const char* op) {
  // On the backend's stream, so the next label check is ordered after the reset (a cudaMemcpy
  // from pageable memory runs on the legacy stream, which a non-blocking stream does not wait
  // for). {first = ~0, flag = 0, classes = 0}.
  static_assert(sizeof(kernels::ErrorRecord) == 16 && offsetof(kernels::ErrorRecord, flag) == 8);
  check_cuda(cudaMemsetAsync(&error_->first, 0xFF, sizeof error_->first, stream_), op,
             "cudaMemsetAsync of the label check");
  check_cuda(cudaMemsetAsync(&error_->flag, 0, 2 * sizeof(int), stream_), op,
             "cudaMemsetAsync of the label check");
}

void CudaBackend::check_deferred_errors() {
  check_id_errors();  // cuda_backend_embedding.cpp
  if (!labels_pending_) return;
  labels_pending_ = false;
  kernels::ErrorRecord rec{};
  // The stream is idle (sync() waited for it), so a blocking read sees the kernels' writes.
  check_cuda(cudaMemcpy(&rec, error_, sizeof rec, cudaMemcpyDeviceToHost), "softmax_cross_entropy",
             "reading the label check");
  if (rec.flag == 0) return;
  reset_error_record("softmax_cross_entropy");
  const auto row = static_cast<long long>(rec.first >> 32);
  const auto label = static_cast<std::int32_t>(static_cast<std::uint32_t>(rec.first & 0xFFFFFFFFu));
  fail("softmax_cross_entropy",
       "label " + std::to_string(label) + " at row " + std::to_string(row) + " is outside [0, " +
           std::to_string(rec.classes) +
           ") (found on the device; loss, correct and dlogits were "
           "left untouched)",
       "check the dataset's labels against the model's number of classes");
}

sdk::BackendCapabilities CudaBackend::capabilities() const {
  sdk::BackendCapabilities caps;
  caps.kind = "cuda";
  const std::string sm = "sm_" + std::to_string(sm_);
  caps.device_name = name_ + " (" + sm + ", device " + std::to_string(device_) + ", " +
                     std::to_string(multiprocessors_) + " SMs)";
  caps.memory_bytes = total_memory_;
  caps.threads = 1;
  const bool tensor_cores_bf16 = sm_ >= 80;
  caps.gemm_inputs.push_back(
      {DType::fp32, true, "cuBLASLt, CUBLAS_COMPUTE_32F (full fp32 on the CUDA cores)"});
  caps.gemm_inputs.push_back(
      {DType::tf32, tensor_cores_bf16,
       "cuBLASLt, CUBLAS_COMPUTE_32F_FAST_TF32 (Tensor Cores, fp32 accumulation)"});
  caps.gemm_inputs.push_back(
      {DType::bf16, tensor_cores_bf16, "cuBLASLt bf16 Tensor Cores, fp32 accumulation"});
  caps.gemm_inputs.push_back({DType::fp16, true, "cuBLASLt fp16 Tensor Cores, fp32 accumulation"});
  // Before sm_89 FP8 is not declared at all: emulating it on a GPU would only be slower than
  // bf16, so an FP8 policy stops at adapt_to with the reason (the CPU backend is the emulator).
  if (gemm_->fp8_native())
    for (DType t : {DType::fp8_e4m3, DType::fp8_e5m2})
      caps.gemm_inputs.push_back(
          {t, true,
           "cuBLASLt FP8 Tensor Cores (TN layout, scale_inv as A/B scale pointers, fp32 "
           "accumulation); e5m2 x e5m2 is decoded to bf16"});
  caps.features.push_back(sm);
  caps.features.push_back("cc_" + std::to_string(sm_ / 10) + "." + std::to_string(sm_ % 10));
  caps.features.push_back("tensor_cores");
  if (tensor_cores_bf16) {
    caps.features.push_back("bf16");
    caps.features.push_back("tf32");
  }
  if (gemm_->fp8_native()) caps.features.push_back("fp8");
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  caps.features.push_back("cuda_runtime_" + std::to_string(runtime / 1000) + "." +
                          std::to_string(runtime % 1000 / 10));
  caps.features.push_back("cuda_driver_" + std::to_string(driver / 1000) + "." +
                          std::to_string(driver % 1000 / 10));
  caps.features.push_back("cublasLt_" + std::to_string(cublasLtGetVersion()));
  return caps;
}

// --- memory ------------------------------------------------------------------------------------

void* CudaBackend::allocate(std::size_t bytes) {
  activate();
  return allocator_.allocate(bytes);
}

void CudaBackend::deallocate(void* ptr) noexcept {
  if (ptr == nullptr) return;
  allocator_.deallocate(ptr);  // not ours (or freed twice): ignored, never freed
}

sdk::MemoryStats CudaBackend::memory_stats() const {
  return {allocator_.current(), allocator_.peak(), allocator_.live_count()};
}

void CudaBackend::copy_from_host(TensorView dst, const void* src) {
  activate();
  require_present("copy_from_host", "dst", dst);
  staging_.copy(dst.data, src, dst.bytes(), stream_, "copy_from_host");
}

void CudaBackend::copy_to_host(void* dst, TensorView src) {
  activate();
  require_present("copy_to_host", "src", src);
  if (src.bytes() != 0)
    check_cuda(cudaMemcpyAsync(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, stream_),
               "copy_to_host", "cudaMemcpyAsync");
  sync("copy_to_host");
}

void CudaBackend::copy(TensorView dst, TensorView src) {
  activate();
  checks().copy_args(dst, src);
  if (dst.bytes() != 0 && dst.data != src.data)
    check_cuda(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, stream_),
               "copy", "cudaMemcpyAsync");
}

void CudaBackend::synchronize() {
  activate();
  sync("synchronize");
}

// --- GEMM and cast -----------------------------------------------------------------------------

void CudaBackend::gemm(const sdk::GemmArgs& args) {
  activate();
  gemm_->run(args);
  account_buffers();
}

void CudaBackend::gemm_strided_batched(const sdk::GemmBatchedArgs& args) {
  activate();
  checks().gemm_batched_shape(args);
  gemm_->run_batched(args);
  account_buffers();
}

void CudaBackend::cast(TensorView src, TensorView dst, const sdk::CastArgs& args) {
  activate();
  checks().cast_args(src, dst, args);
  float* amax = args.amax.empty() ? nullptr : args.amax.as<float>();
  check_cuda(kernels::cast(src.data, elem_of(src.dtype), dst.data, elem_of(dst.dtype),
                           dst.dtype == DType::tf32, src.numel(), args.scale, args.saturate, amax,
                           stream_),
             "cast", "cast kernel launch");
}

// --- layer kernels -------------------------------------------------------------------------------

void CudaBackend::bias_grad(TensorView dy, TensorView dbias, bool accumulate) {
  activate();
  const auto [rows, n] = checks().bias_grad_shape(dy, dbias);
  float* partial = partial_.as<float>(
      std::max<std::size_t>(1, kernels::column_sum_scratch(rows, n)), stream_, "bias_grad");
  account_buffers();
  check_cuda(kernels::bias_grad(dy.data, elem_of(dy.dtype), dbias.as<float>(), rows, n, accumulate,
                                partial, stream_),
             "bias_grad", "kernel launch");
}

void CudaBackend::activation_forward(sdk::Activation act, TensorView x, TensorView y) {
  activate();
  require_storage("activation_forward", "x", x);
  require_storage("activation_forward", "y", y);
  require_numel("activation_forward", "y", y, x.numel());
  check_cuda(
      kernels::activation_forward(act == sdk::Activation::relu ? 0 : 1, x.data, elem_of(x.dtype),
                                  y.data, elem_of(y.dtype), x.numel(), stream_),
      "activation_forward", "kernel launch");
}

void CudaBackend::activation_backward(sdk::Activation act, TensorView x, TensorView dy,
                                      TensorView dx) {
  activate();
  require_storage("activation_backward", "x", x);
  require_storage("activation_backward", "dy", dy);
  require_storage("activation_backward", "dx", dx);
  require_numel("activation_backward", "dy", dy, x.numel());
  require_numel("activation_backward", "dx", dx, x.numel());
  check_cuda(kernels::activation_backward(act == sdk::Activation::relu ? 0 : 1, x.data,
                                          elem_of(x.dtype), dy.data, elem_of(dy.dtype), dx.data,
                                          elem_of(dx.dtype), x.numel(), stream_),
             "activation_backward", "kernel launch");
}

void CudaBackend::layernorm_forward(TensorView x, TensorView gamma, TensorView beta, float eps,
                                    TensorView y, TensorView mean, TensorView rstd) {
  activate();
  constexpr const char* op = "layernorm_forward";
  const auto [rows, n] = checks().layernorm_forward_shape(x, gamma, beta, y, mean, rstd);
  check_cuda(kernels::layernorm_forward(x.data, elem_of(x.dtype), ptr_or_null(gamma),
                                        elem_of(gamma.dtype), ptr_or_null(beta),
                                        elem_of(beta.dtype), eps, y.data, elem_of(y.dtype),
                                        mean.as<float>(), rstd.as<float>(), rows, n, stream_),
             op, "kernel launch");
}

void CudaBackend::layernorm_backward(TensorView dy, TensorView x, TensorView gamma, TensorView mean,
                                     TensorView rstd, TensorView dx, TensorView dgamma,
                                     TensorView dbeta, bool accumulate) {
  activate();
  constexpr const char* op = "layernorm_backward";
  const auto [rows, n] =
      checks().layernorm_backward_shape(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  float* partial = nullptr;
  if (!dgamma.empty() || !dbeta.empty()) {
    partial = partial_.as<float>(std::max<std::size_t>(1, 2 * kernels::column_sum_scratch(rows, n)),
                                 stream_, op);
    account_buffers();
  }
  check_cuda(
      kernels::layernorm_backward(
          dy.data, elem_of(dy.dtype), x.data, elem_of(x.dtype), ptr_or_null(gamma),
          elem_of(gamma.dtype), mean.as<const float>(), rstd.as<const float>(), dx.data,
          elem_of(dx.dtype), dgamma.empty() ? nullptr : dgamma.as<float>(),
          dbeta.empty() ? nullptr : dbeta.as<float>(), accumulate, rows, n, partial, stream_),
      op, "kernel launch");
}

void CudaBackend::softmax_cross_entropy(TensorView logits, TensorView labels, float grad_scale,
                                        float label_smoothing, TensorView loss, TensorView correct,
                                        TensorView dlogits) {
  activate();
  constexpr const char* op = "softmax_cross_entropy";
  const auto [rows, classes] =
      checks().softmax_cross_entropy_shape(logits, labels, label_smoothing, loss, correct, dlogits);
  if (rows > INT32_MAX || classes > INT32_MAX)
    fail(op, "logits " + describe(logits) + " is too large for the kernel's 32-bit row index",
         "split the batch");
  auto* row_loss = partial_.as<double>(static_cast<std::size_t>(rows), stream_, op);
  auto* row_ok = partial2_.as<int>(static_cast<std::size_t>(rows), stream_, op);
  account_buffers();
  check_cuda(
      kernels::softmax_cross_entropy(
          logits.data, elem_of(logits.dtype), labels.as<const std::int32_t>(), grad_scale,
          label_smoothing, loss.as<float>(), correct.empty() ? nullptr : correct.as<std::int32_t>(),
          dlogits.empty() ? nullptr : dlogits.data, elem_of(dlogits.dtype), rows, classes, row_loss,
          row_ok, error_, stream_),
      op, "kernel launch");
  labels_pending_ = true;
}

// --- element-wise ------------------------------------------------------------------------------

void CudaBackend::fill(TensorView x, float value) {
  activate();
  require_present("fill", "x", x);
  if (x.dtype != DType::int32) require_storage("fill", "x", x);
  check_cuda(kernels::fill(x.data, elem_of(x.dtype), x.numel(), value, stream_), "fill",
             "kernel launch");
}

void CudaBackend::axpy(float alpha, TensorView x, TensorView y) {
  activate();
  require_storage("axpy", "x", x);
  require_fp32("axpy", "y", y);
  require_numel("axpy", "y", y, x.numel());
  check_cuda(kernels::axpy(alpha, x.data, elem_of(x.dtype), y.as<float>(), x.numel(), stream_),
             "axpy", "kernel launch");
}

// --- multi-tensor machinery
// ------------------------------------------------------------------------

template <class Ref>
int CudaBackend::upload_tables(const std::vector<Ref>& refs,
                               const std::vector<std::int64_t>& numels, const Ref** dev_refs,
                               const kernels::Chunk** dev_chunks, const char* op) {
  std::vector<kernels::Chunk> chunks;
  for (std::size_t t = 0; t < numels.size(); ++t)
    for (std::int64_t b = 0; b < numels[t]; b += kernels::kChunkElems)
      chunks.push_back({static_cast<std::int32_t>(t),
                        static_cast<std::int32_t>(std::min(kernels::kChunkElems, numels[t] - b)),
                        b});
  if (chunks.size() > static_cast<std::size_t>(INT32_MAX))
    fail(op, "too many elements for one call", "split the tensor list");
  const std::size_t refs_bytes = (refs.size() * sizeof(Ref) + 255) / 256 * 256;
  const std::size_t total = refs_bytes + chunks.size() * sizeof(kernels::Chunk);
  host_tables_.resize(std::max<std::size_t>(total, 1));
  if (!refs.empty()) std::memcpy(host_tables_.data(), refs.data(), refs.size() * sizeof(Ref));
  if (!chunks.empty())
    std::memcpy(host_tables_.data() + refs_bytes, chunks.data(),
                chunks.size() * sizeof(kernels::Chunk));
  auto* dev =
      static_cast<unsigned char*>(tables_.get(std::max<std::size_t>(total, 1), stream_, op));
  account_buffers();
  // Through the pinned staging slots: no wait on the stream, and the host vector is free for the
  // next op on return.
  staging_.copy(dev, host_tables_.data(), total, stream_, op);
  *dev_refs = reinterpret_cast<const Ref*>(dev);
  *dev_chunks = reinterpret_cast<const kernels::Chunk*>(dev + refs_bytes);
  return static_cast<int>(chunks.size());
}

template <class T>
T* CudaBackend::host_result(std::size_t count) {
  if (count * sizeof(T) > kPinnedBytes) return nullptr;
  return static_cast<T*>(pinned_);
}

CudaBackend::TensorTables CudaBackend::tensor_tables(std::span<const TensorView> tensors,
                                                     const char* op, const char* name,
                                                     bool fp32_only) {
  std::vector<kernels::TensorRef> refs;
  std::vector<std::int64_t> numels;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::string what = std::string(name) + "[" + std::to_string(i) + "]";
    if (fp32_only)
      require_fp32(op, what, tensors[i]);
    else
      require_storage(op, what, tensors[i]);
    refs.push_back({tensors[i].data, tensors[i].numel(), elem_of(tensors[i].dtype), 0});
    numels.push_back(tensors[i].numel());
  }
  TensorTables t;
  t.count = upload_tables(refs, numels, &t.refs, &t.chunks, op);
  return t;
}

int* CudaBackend::enqueue_unscale(const TensorTables& t, float inv_scale, const char* op) {
  int* found = flags_.as<int>(1, stream_, op);
  account_buffers();
  check_cuda(cudaMemsetAsync(found, 0, sizeof(int), stream_), op, "cudaMemsetAsync");
  check_cuda(kernels::unscale_and_check(t.refs, t.chunks, t.count, inv_scale, found, stream_), op,
             "unscale kernel launch");
  return found;
}

double* CudaBackend::enqueue_sum_of_squares(const TensorTables& t, const char* op) {
  double* partial = partial_.as<double>(std::max(1, t.count), stream_, op);
  double* result = partial2_.as<double>(1, stream_, op);
  account_buffers();
  check_cuda(kernels::sum_of_squares(t.refs, t.chunks, t.count, partial, result, stream_), op,
             "sum of squares kernel launch");
  return result;
}

bool CudaBackend::unscale_and_check_finite(std::span<const TensorView> grads, float inv_scale) {
  activate();
  constexpr const char* op = "unscale_and_check_finite";
  int* found = enqueue_unscale(tensor_tables(grads, op, "grads", true), inv_scale, op);
  int* host = host_result<int>(1);
  check_cuda(cudaMemcpyAsync(host, found, sizeof(int), cudaMemcpyDeviceToHost, stream_), op,
             "cudaMemcpyAsync");
  sync(op);
  return *host != 0;
}

double CudaBackend::sum_of_squares(std::span<const TensorView> tensors) {
  activate();
  constexpr const char* op = "sum_of_squares";
  double* result = enqueue_sum_of_squares(tensor_tables(tensors, op, "tensors", false), op);
  double* host = host_result<double>(1);
  check_cuda(cudaMemcpyAsync(host, result, sizeof(double), cudaMemcpyDeviceToHost, stream_), op,
             "cudaMemcpyAsync");
  sync(op);
  return *host;
}

sdk::GradientCheckFacet::GradientCheck CudaBackend::unscale_check_and_sum_squares(
    std::span<const TensorView> grads, float inv_scale) {
  activate();
  constexpr const char* op = "unscale_check_and_sum_squares";
  // One table for both kernels; the sum runs the same kernel and partition as sum_of_squares(),
  // after the unscale in stream order, so the result equals the two calls made in turn.
  const TensorTables t = tensor_tables(grads, op, "grads", true);
  int* found = enqueue_unscale(t, inv_scale, op);
  double* result = enqueue_sum_of_squares(t, op);
  double* host = host_result<double>(2);  // [0]: the sum, [1]: found_inf's int in its first bytes
  check_cuda(cudaMemcpyAsync(host, result, sizeof(double), cudaMemcpyDeviceToHost, stream_), op,
             "cudaMemcpyAsync");
  check_cuda(cudaMemcpyAsync(host + 1, found, sizeof(int), cudaMemcpyDeviceToHost, stream_), op,
             "cudaMemcpyAsync");
  sync(op);
  GradientCheck r;
  r.sum_of_squares = host[0];
  int flag = 0;
  std::memcpy(&flag, host + 1, sizeof flag);
  r.found_inf = flag != 0;
  return r;
}

int CudaBackend::first_nonfinite(std::span<const TensorView> tensors) {
  activate();
  constexpr const char* op = "first_nonfinite";
  if (tensors.empty()) return -1;
  const TensorTables t = tensor_tables(tensors, op, "tensors", false);
  int* flags = flags_.as<int>(tensors.size(), stream_, op);
  account_buffers();
  check_cuda(cudaMemsetAsync(flags, 0, tensors.size() * sizeof(int), stream_), op,
             "cudaMemsetAsync");
  check_cuda(kernels::find_nonfinite(t.refs, t.chunks, t.count, flags, stream_), op,
             "kernel launch");
  std::vector<int> host(tensors.size());
  check_cuda(cudaMemcpyAsync(host.data(), flags, host.size() * sizeof(int), cudaMemcpyDeviceToHost,
                             stream_),
             op, "cudaMemcpyAsync");
  sync(op);
  for (std::size_t t = 0; t < host.size(); ++t)
    if (host[t] != 0) return static_cast<int>(t);
  return -1;
}

namespace {

void validate_param(std::string_view op, std::size_t i, const sdk::ParamTensors& p,
                    bool need_state1, bool need_state2) {
  checks().optimizer_param(op, i, p, need_state1, need_state2);
}

kernels::ParamRef param_ref(const sdk::ParamTensors& p) {
  return {p.master.as<float>(),
          p.grad.as<const float>(),
          p.working.empty() ? nullptr : p.working.data,
          p.state1.empty() ? nullptr : p.state1.as<float>(),
          p.state2.empty() ? nullptr : p.state2.as<float>(),
          elem_of(p.working.dtype),
          0};
}

}  // namespace

void CudaBackend::sgd_update(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> params) {
  activate();
  constexpr const char* op = "sgd_update";
  if (h.nesterov && (h.momentum <= 0.0f || h.dampening != 0.0f))
    fail(op,
         "nesterov needs momentum > 0 and dampening = 0 (momentum " + std::to_string(h.momentum) +
             ", dampening " + std::to_string(h.dampening) + ")",
         "set momentum > 0 and dampening = 0, or turn nesterov off (as torch.optim.SGD requires)");
  std::vector<kernels::ParamRef> refs;
  std::vector<std::int64_t> numels;
  for (std::size_t i = 0; i < params.size(); ++i) {
    validate_param(op, i, params[i], h.momentum != 0.0f, false);
    refs.push_back(param_ref(params[i]));
    numels.push_back(params[i].master.numel());
  }
  const kernels::ParamRef* dev_refs = nullptr;
  const kernels::Chunk* dev_chunks = nullptr;
  const int count = upload_tables(refs, numels, &dev_refs, &dev_chunks, op);
  const kernels::SgdArgs args{h.lr,         h.momentum, h.dampening,  h.weight_decay,
                              h.grad_scale, h.nesterov, h.first_step, h.momentum != 0.0f};
  check_cuda(kernels::sgd_update(args, dev_refs, dev_chunks, count, stream_), op, "kernel launch");
}

void CudaBackend::adamw_update(const sdk::AdamWHyper& h,
                               std::span<const sdk::ParamTensors> params) {
  activate();
  constexpr const char* op = "adamw_update";
  if (h.step < 1)
    fail(op, "step = " + std::to_string(h.step) + " but it is the 1-based count of applied steps",
         "pass step >= 1 (1 on the first update)");
  std::vector<kernels::ParamRef> refs;
  std::vector<std::int64_t> numels;
  for (std::size_t i = 0; i < params.size(); ++i) {
    validate_param(op, i, params[i], true, true);
    refs.push_back(param_ref(params[i]));
    numels.push_back(params[i].master.numel());
  }
  // Bias corrections in double on the host, exactly as the CPU reference (and PyTorch) does.
  const double t = static_cast<double>(h.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), t);
  const kernels::AdamWArgs args{h.beta1,
                                h.beta2,
                                h.eps,
                                h.grad_scale,
                                1.0f - h.lr * h.weight_decay,
                                static_cast<float>(static_cast<double>(h.lr) / bc1),
                                static_cast<float>(std::sqrt(bc2))};
  const kernels::ParamRef* dev_refs = nullptr;
  const kernels::Chunk* dev_chunks = nullptr;
  const int count = upload_tables(refs, numels, &dev_refs, &dev_chunks, op);
  check_cuda(kernels::adamw_update(args, dev_refs, dev_chunks, count, stream_), op,
             "kernel launch");
}

// --- facets ----------------------------------------------------------------------------------

sdk::Facet* CudaBackend::find_facet(std::string_view name) {
  return sdk::facet_among<sdk::GemmFacet, sdk::ActivationFacet, sdk::GradientCheckFacet,
                          sdk::ForeachFacet, sdk::LayerNormFacet, sdk::BatchNormFacet,
#ifdef MIXTRAIN_HAVE_CUDNN
                          sdk::ConvolutionFacet,
#endif
                          sdk::LossFacet, sdk::OptimizerFacet, sdk::ResidualFacet,
                          sdk::AttentionFacet, sdk::EmbeddingFacet, sdk::DropoutFacet,
                          sdk::StepGraphFacet, sdk::NativeStreamFacet>(*this, name);
}

bool CudaBackend::supports(sdk::GemmOp op, std::span<const DType> dtypes) const {
  return gemm_supported(capabilities(), op, dtypes);
}

// --- foreach ops
// --------------------------------------------------------------------------------------

void CudaBackend::foreach_launch(const char* op, kernels::ForeachKind kind,
                                 std::span<const TensorView> self, std::span<const TensorView> a,
                                 std::span<const TensorView> b, float s0, float s1, int lists) {
  activate();
  if (lists == 0)
    checks().foreach_lists(op, self);
  else if (lists == 1)
    checks().foreach_lists(op, self, {a});
  else
    checks().foreach_lists(op, self, {a, b});
  // One launch for the whole list: the tensors' chunks go through the multi-tensor tables.
  std::vector<kernels::ForeachRef> refs;
  std::vector<std::int64_t> numels;
  for (std::size_t i = 0; i < self.size(); ++i) {
    refs.push_back({self[i].as<float>(), lists < 1 ? nullptr : a[i].as<const float>(),
                    lists < 2 ? nullptr : b[i].as<const float>(), self[i].numel()});
    numels.push_back(self[i].numel());
  }
  if (refs.empty()) return;
  const kernels::ForeachRef* dev_refs = nullptr;
  const kernels::Chunk* dev_chunks = nullptr;
  const int count = upload_tables(refs, numels, &dev_refs, &dev_chunks, op);
  check_cuda(kernels::foreach_op(kind, dev_refs, dev_chunks, count, s0, s1, stream_), op,
             "kernel launch");
}

void CudaBackend::foreach_mul_scalar(std::span<const TensorView> self, float scalar) {
  foreach_launch("foreach_mul_scalar", kernels::ForeachKind::mul, self, {}, {}, scalar, 0.0f, 0);
}
void CudaBackend::foreach_mul(std::span<const TensorView> self, std::span<const TensorView> other) {
  foreach_launch("foreach_mul", kernels::ForeachKind::mul, self, other, {}, 1.0f, 0.0f, 1);
}
void CudaBackend::foreach_add_scalar(std::span<const TensorView> self, float scalar) {
  foreach_launch("foreach_add_scalar", kernels::ForeachKind::add_scalar, self, {}, {}, scalar, 0.0f,
                 0);
}
void CudaBackend::foreach_add(std::span<const TensorView> self, std::span<const TensorView> other,
                              float alpha) {
  foreach_launch("foreach_add", kernels::ForeachKind::add, self, other, {}, alpha, 0.0f, 1);
}
void CudaBackend::foreach_addcmul(std::span<const TensorView> self, std::span<const TensorView> t1,
                                  std::span<const TensorView> t2, float value) {
  foreach_launch("foreach_addcmul", kernels::ForeachKind::addcmul, self, t1, t2, value, 0.0f, 2);
}
void CudaBackend::foreach_sqrt(std::span<const TensorView> self) {
  foreach_launch("foreach_sqrt", kernels::ForeachKind::sqrt, self, {}, {}, 0.0f, 0.0f, 0);
}
void CudaBackend::foreach_sign(std::span<const TensorView> self) {
  foreach_launch("foreach_sign", kernels::ForeachKind::sign, self, {}, {}, 0.0f, 0.0f, 0);
}
void CudaBackend::foreach_lerp(std::span<const TensorView> self, std::span<const TensorView> end,
                               float weight) {
  foreach_launch("foreach_lerp", kernels::ForeachKind::lerp, self, end, {}, weight, 0.0f, 1);
}
void CudaBackend::foreach_clamp(std::span<const TensorView> self, float lo, float hi) {
  if (!(lo <= hi))
    fail("foreach_clamp", "lo = " + std::to_string(lo) + " is above hi = " + std::to_string(hi),
         "pass lo <= hi");
  foreach_launch("foreach_clamp", kernels::ForeachKind::clamp, self, {}, {}, lo, hi, 0);
}

}  // namespace mixtrain::backend_cuda
