// CudaContext: the device, its stream and the buffers and records every facet shares.
#include "cuda_context.h"

#include <cublasLt.h>

#include <cstddef>
#include <string>

#include "cuda_block_scaled_gemm.h"
#include "cuda_byte_upload.h"
#include "cuda_cast_fill.h"
#include "cuda_gemm.h"
#include "mixtrain/sdk/support/backend_features.h"
#ifdef MIXTRAIN_HAVE_CUDNN
#include "cuda_conv_plans.h"
#endif
#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
#include "cuda_sdpa_graphs.h"
#endif

namespace mixtrain::backend_cuda {

using kernels::Elem;
using sdk::DType;

namespace {

const char* kNoDeviceHint =
    "run on a machine with an NVIDIA GPU and its driver (nvidia-smi lists it), check "
    "CUDA_VISIBLE_DEVICES, or run on the CPU backend (backend.type = \"cpu\"; on the command "
    "line --set backend.type=cpu)";

}  // namespace

int CudaContext::device_count() {
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

CudaContext::CudaContext(const CudaOptions& options)
    : device(options.device),
      deterministic_attention(options.deterministic_attention),
      deterministic_convolutions(options.deterministic_convolutions),
      layernorm_backward_one_pass(options.layernorm_backward_one_pass),
      fp8_cast_transpose(options.fp8_cast_transpose),
      fp8_gradient_cast(options.fp8_gradient_cast),
      conv_dgrad_accumulate(options.conv_dgrad_accumulate),
      conv_autotune(options.conv_autotune),
      conv_wgrad_in_operand_dtype(options.conv_wgrad_in_operand_dtype),
      conv_workspace(options.conv_workspace),
      logger_(options.logger) {
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
  sm = prop.major * 10 + prop.minor;
  device_name = prop.name;
  total_memory = prop.totalGlobalMem;
  multiprocessors = prop.multiProcessorCount;
  shared_memory_optin = prop.sharedMemPerBlockOptin;
  try {
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "create",
               "cudaStreamCreateWithFlags");
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&label_record), sizeof(kernels::ErrorRecord)),
               "create", "cudaMalloc of the error record");
    check_cuda(cudaMallocHost(&pinned_, kPinnedBytes), "create", "cudaMallocHost");
    reset_label_record("create");
    // A first launch tells whether this build has machine code (or PTX) for the device.
    const cudaError_t launch = kernels::fill(&label_record->classes, Elem::i32, 1, 0.0f, stream);
    const cudaError_t done = launch == cudaSuccess ? cudaStreamSynchronize(stream) : launch;
    if (done != cudaSuccess) {
      (void)cudaGetLastError();
      fail("create",
           "cannot run kernels on device " + std::to_string(device) + " (" + device_name + ", sm_" +
               std::to_string(sm) + "): " + cuda_error_text(done),
           "rebuild with CMAKE_CUDA_ARCHITECTURES including " + std::to_string(sm) +
               " (this build targets sm_80 and sm_90 with compute_90 PTX by default)");
    }
    GemmTuning tuning;
    tuning.autotune_candidates = options.gemm_autotune;
    tuning.realign = options.gemm_realign;
    gemm = std::make_unique<GemmEngine>(sm, stream, options.fp8_fast_accumulation, tuning);
    // Scratch that cannot grow first takes back what the allocator caches; the stream is
    // synchronised first because cached blocks may still be read by enqueued work.
    auto give_back_cache = [this] {
      cudaStreamSynchronize(stream);
      allocator.release_cached();
    };
    gemm->set_out_of_memory_hook(give_back_cache);
    gemm->set_graph_guard(&live_graphs);
    block_gemm = std::make_unique<BlockScaledGemmEngine>(gemm->handle(), gemm->workspace(),
                                                         gemm->workspace_bytes(), stream);
    block_gemm->set_out_of_memory_hook(give_back_cache);
    block_gemm->set_graph_guard(&live_graphs);
    for (DeviceScratch* s : {&tables, &partial, &partial2, &flags})
      s->set_out_of_memory_hook(give_back_cache);
    for (DeviceScratch* s : {&tables, &partial, &partial2, &flags, &id_check})
      s->set_graph_guard(&live_graphs);
  } catch (...) {
    block_gemm.reset();
    gemm.reset();
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
    if (label_record != nullptr) cudaFree(label_record);
    if (stream != nullptr) cudaStreamDestroy(stream);
    pinned_ = nullptr;
    label_record = nullptr;
    stream = nullptr;
    throw;
  }
  account_buffers();
}

CudaContext::~CudaContext() {
  activate_quietly();
  if (stream != nullptr) cudaStreamSynchronize(stream);
  bytes_in.reset();  // waits for the copy stream, which may still read a staging slot
  staging.release();
#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
  sdpa.reset();
#endif
#ifdef MIXTRAIN_HAVE_CUDNN
  conv.reset();
#endif
  block_gemm.reset();
  gemm.reset();
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  if (label_record != nullptr) cudaFree(label_record);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

void CudaContext::activate() const {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device) return;
  check_cuda(cudaSetDevice(device), "activate", "cudaSetDevice(" + std::to_string(device) + ")");
}

bool CudaContext::activate_quietly() const noexcept {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device) return true;
  if (cudaSetDevice(device) == cudaSuccess) return true;
  (void)cudaGetLastError();  // not left for the next call to find
  return false;
}

std::size_t CudaContext::cudnn_bytes() const {
  std::size_t bytes = 0;
#ifdef MIXTRAIN_HAVE_CUDNN
  if (conv) bytes += conv->device_bytes();
#endif
#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
  if (sdpa) bytes += sdpa->device_bytes();
#endif
  return bytes;
}

void CudaContext::account_buffers() {
  // The fixed cuBLASLt workspace is not counted (like a library's own handle state); grow-only
  // scratch is, as the CPU backend counts its GEMM scratch.
  const std::size_t now = gemm->device_bytes() - gemm->workspace_bytes() +
                          block_gemm->device_bytes() + tables.capacity() + partial.capacity() +
                          partial2.capacity() + flags.capacity() + cudnn_bytes() +
                          (bytes_in ? bytes_in->device_bytes() : 0);
  if (now == buffer_bytes_) return;
  allocator.account_external(static_cast<std::ptrdiff_t>(now) -
                             static_cast<std::ptrdiff_t>(buffer_bytes_));
  buffer_bytes_ = now;
}

void CudaContext::sync(const char* op) {
  check_cuda(cudaStreamSynchronize(stream), op, "cudaStreamSynchronize");
  check_deferred_errors();
}

void CudaContext::reset_label_record(const char* op) {
  // On the context's stream, so the next label check is ordered after the reset (a cudaMemcpy
  // from pageable memory runs on the legacy stream, which a non-blocking stream does not wait
  // for). {first = ~0, flag = 0, classes = 0}.
  static_assert(sizeof(kernels::ErrorRecord) == 16 && offsetof(kernels::ErrorRecord, flag) == 8);
  check_cuda(cudaMemsetAsync(&label_record->first, 0xFF, sizeof label_record->first, stream), op,
             "cudaMemsetAsync of the label check");
  check_cuda(cudaMemsetAsync(&label_record->flag, 0, 2 * sizeof(int), stream), op,
             "cudaMemsetAsync of the label check");
}

void CudaContext::check_deferred_errors() {
  check_id_errors();
  if (!labels_pending) return;
  labels_pending = false;
  kernels::ErrorRecord rec{};
  // The stream is idle (sync() waited for it), so a blocking read sees the kernels' writes.
  check_cuda(cudaMemcpy(&rec, label_record, sizeof rec, cudaMemcpyDeviceToHost),
             "softmax_cross_entropy", "reading the label check");
  if (rec.flag == 0) return;
  reset_label_record("softmax_cross_entropy");
  const auto row = static_cast<long long>(rec.first >> 32);
  const auto label = static_cast<std::int32_t>(static_cast<std::uint32_t>(rec.first & 0xFFFFFFFFu));
  fail("softmax_cross_entropy",
       "label " + std::to_string(label) + " at row " + std::to_string(row) + " is outside [0, " +
           std::to_string(rec.classes) +
           ") (found on the device; loss, correct and dlogits were "
           "left untouched)",
       "check the dataset's labels against the model's number of classes");
}

kernels::ErrorRecord* CudaContext::id_record(const char* op) {
  const bool fresh = id_check.capacity() == 0;
  auto* rec = id_check.as<kernels::ErrorRecord>(1, stream, op);
  if (fresh) {
    // {first = ~0, flag = 0, classes = 0}, on the stream so the first check is ordered after it.
    check_cuda(cudaMemsetAsync(&rec->first, 0xFF, sizeof rec->first, stream), op,
               "cudaMemsetAsync of the id check");
    check_cuda(cudaMemsetAsync(&rec->flag, 0, 2 * sizeof(int), stream), op,
               "cudaMemsetAsync of the id check");
  }
  return rec;
}

void CudaContext::check_id_errors() {
  if (!ids_pending) return;
  ids_pending = false;
  auto* dev = static_cast<kernels::ErrorRecord*>(
      id_check.get(sizeof(kernels::ErrorRecord), stream, "synchronize"));
  kernels::ErrorRecord rec{};
  // The stream is idle (sync() waited for it), so a blocking read sees the kernels' writes.
  check_cuda(cudaMemcpy(&rec, dev, sizeof rec, cudaMemcpyDeviceToHost), "gather",
             "reading the id check");
  if (rec.flag == 0) return;
  const char* op = (rec.flag & 1) != 0 ? "scatter_add" : "gather";
  check_cuda(cudaMemsetAsync(&dev->first, 0xFF, sizeof dev->first, stream), op,
             "cudaMemsetAsync of the id check");
  check_cuda(cudaMemsetAsync(&dev->flag, 0, 2 * sizeof(int), stream), op,
             "cudaMemsetAsync of the id check");
  const auto row = static_cast<long long>(rec.first >> 32);
  const auto id = static_cast<std::int32_t>(static_cast<std::uint32_t>(rec.first & 0xFFFFFFFFu));
  fail(op,
       "id " + std::to_string(id) + " at row " + std::to_string(row) + " is outside [0, " +
           std::to_string(rec.classes) + ") (found on the device; " +
           ((rec.flag & 1) != 0 ? "dtable was" : "out was") +
           " left untouched, as was every embedding output until this call)",
       "the ids index the table's rows: check the data's token ids against the model's "
       "vocabulary size");
}

void CudaContext::free_retired_scratch() noexcept {
  allocator.release_held();
  gemm->free_retired_scratch();
  block_gemm->free_retired_scratch();
  for (DeviceScratch* s : {&tables, &partial, &partial2, &flags, &id_check}) s->free_retired();
#ifdef MIXTRAIN_HAVE_CUDNN
  if (conv)
    for (DeviceScratch* s : conv->scratch()) s->free_retired();
#endif
#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
  if (sdpa) sdpa->workspace.free_retired();
#endif
}

ByteUpload& CudaContext::byte_upload(const char* op) {
  if (!bytes_in)
    bytes_in = std::make_unique<ByteUpload>(
        [this] {
          cudaStreamSynchronize(stream);
          allocator.release_cached();
        },
        op);
  return *bytes_in;
}

#ifdef MIXTRAIN_HAVE_CUDNN
ConvState& CudaContext::conv_state() {
  if (!conv) {
    conv = std::make_unique<ConvState>(deterministic_convolutions, conv_autotune);
    auto give_back_cache = [this] {
      cudaStreamSynchronize(stream);
      allocator.release_cached();
    };
    for (DeviceScratch* s : conv->scratch()) {
      s->set_out_of_memory_hook(give_back_cache);
      s->set_graph_guard(&live_graphs);
    }
  }
  return *conv;
}
#endif

#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
SdpaState& CudaContext::sdpa_state() {
  if (!sdpa) {
    sdpa = std::make_unique<SdpaState>();
    sdpa->workspace.set_out_of_memory_hook([this] {
      cudaStreamSynchronize(stream);
      allocator.release_cached();
    });
    sdpa->workspace.set_graph_guard(&live_graphs);
  }
  return *sdpa;
}
#endif

sdk::BackendCapabilities CudaContext::capabilities() const {
  sdk::BackendCapabilities caps;
  caps.kind = "cuda";
  const std::string sm_name = "sm_" + std::to_string(sm);
  caps.device_name = device_name + " (" + sm_name + ", device " + std::to_string(device) + ", " +
                     std::to_string(multiprocessors) + " SMs)";
  caps.memory_bytes = total_memory;
  caps.threads = 1;
  const bool tensor_cores_bf16 = sm >= 80;
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
  if (gemm->fp8_native())
    for (DType t : {DType::fp8_e4m3, DType::fp8_e5m2})
      caps.gemm_inputs.push_back(
          {t, true,
           "cuBLASLt FP8 Tensor Cores (TN layout, scale_inv as A/B scale pointers, fp32 "
           "accumulation); e5m2 x e5m2 is decoded to bf16"});
  caps.features.push_back(sm_name);
  caps.features.push_back("cc_" + std::to_string(sm / 10) + "." + std::to_string(sm % 10));
  caps.features.push_back("tensor_cores");
  if (tensor_cores_bf16) {
    caps.features.push_back("bf16");
    caps.features.push_back("tf32");
  }
  if (gemm->fp8_native()) caps.features.push_back("fp8");
  // The alignment lint's cue (mixtrain check): GEMMs with unaligned rows run on padded copies.
  if (gemm->realigns()) caps.features.emplace_back(sdk::kFeatureGemmRealignsRows);
  // cuBLASLt's Tensor Core kernels need rows 16 bytes apart; an odd vocabulary's logits ran
  // align-1 kernels (GPT-2's LM head: 16.6 of 35.4 ms a step on an H200, session 57).
  caps.features.emplace_back(sdk::kFeatureGemmWantsAlignedRows);
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  caps.features.push_back("cuda_runtime_" + std::to_string(runtime / 1000) + "." +
                          std::to_string(runtime % 1000 / 10));
  caps.features.push_back("cuda_driver_" + std::to_string(driver / 1000) + "." +
                          std::to_string(driver % 1000 / 10));
  caps.features.push_back("cublasLt_" + std::to_string(cublasLtGetVersion()));
#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
  // The frontend is header-only: its version is the one built against.
  if (sm >= 80)
    caps.features.push_back("flash_attention_cudnn_frontend_" MIXTRAIN_CUDNN_FRONTEND_VERSION);
#endif
  return caps;
}

}  // namespace mixtrain::backend_cuda
