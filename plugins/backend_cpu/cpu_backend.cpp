// CpuBackend: construction, capabilities, memory, copies, GEMM and cast.
// Layer kernels live in cpu_kernels.cpp, optimizer and mixed-precision machinery in
// cpu_optimizers.cpp.
#include "cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "cpu_access.h"
#include "cpu_eltwise.h"
#include "cpu_features.h"
#include "cpu_gemm.h"
#include "cpu_primitive_cache.h"

namespace mixtrain::backend_cpu {

using sdk::DType;
using sdk::TensorView;

CpuBackend::CpuBackend(int threads, Bf16GemmPath bf16_gemm, Bf16ConvPath bf16_conv,
                       ConvAlgorithm conv_algorithm)
    : threads_(threads > 0 ? threads : std::max(1, omp_get_num_procs())),
      gemm_(std::make_unique<GemmEngine>(bf16_gemm)),
      eltwise_(std::make_unique<EltwiseEngine>()),
      prims_(std::make_unique<PrimitiveCache>()),
      bf16_conv_request_(bf16_conv),
      conv_algorithm_(conv_algorithm) {
  if (threads < 0)
    fail("create", "threads = " + std::to_string(threads) + " is negative",
         "use 0 for all cores or a positive thread count");
  use_threads();
}

CpuBackend::~CpuBackend() {
  std::lock_guard lock(memory_mutex_);
  for (auto& [ptr, bytes] : live_) std::free(ptr);
}

void CpuBackend::use_threads() const {
  if (omp_get_max_threads() != threads_) omp_set_num_threads(threads_);
}

sdk::BackendCapabilities CpuBackend::capabilities() const {
  const CpuInfo cpu = detect_cpu();
  sdk::BackendCapabilities caps;
  caps.kind = "cpu";
  caps.device_name = cpu.model_name + " (" + std::to_string(threads_) + " threads)";
  caps.memory_bytes = cpu.memory_bytes;
  caps.threads = threads_;
  caps.features = cpu.features;
  use_threads();
  const std::string impl = gemm_->fp32_implementation();
  const std::string fp32_gemm = "oneDNN fp32 matmul (" + impl + ")";
  caps.gemm_inputs.push_back({DType::fp32, true, "oneDNN matmul (" + impl + ")"});
  caps.gemm_inputs.push_back(
      {DType::tf32, false,
       "emulated: A and B rounded to tf32 (RNE, 10 mantissa bits) + " + fp32_gemm});
  const std::string bf16_impl = gemm_->bf16_implementation();
  if (gemm_->bf16_native())
    caps.gemm_inputs.push_back(
        {DType::bf16, true,
         "oneDNN bf16 matmul (" + bf16_impl + "), fp32 accumulation (" + gemm_->bf16_note() + ")"});
  else
    caps.gemm_inputs.push_back(
        {DType::bf16, false,
         "emulated: exact bf16 -> fp32 decode + " + fp32_gemm + " (" + gemm_->bf16_note() + ")"});
  caps.gemm_inputs.push_back(
      {DType::fp16, false, "emulated: exact fp16 -> fp32 decode + " + fp32_gemm});
  for (DType t : {DType::fp8_e4m3, DType::fp8_e5m2})
    caps.gemm_inputs.push_back({t, false,
                                "emulated: exact " + std::string(sdk::dtype_name(t)) +
                                    " decode x scale_inv + " + fp32_gemm});
  return caps;
}

// --- memory ------------------------------------------------------------------------------------

void* CpuBackend::allocate(std::size_t bytes) {
  const std::size_t rounded = std::max<std::size_t>(64, (bytes + 63) / 64 * 64);
  void* p = rounded < bytes ? nullptr : std::aligned_alloc(64, rounded);
  if (p == nullptr)
    throw sdk::BackendError("backend_cpu.allocate: cannot allocate " + std::to_string(bytes) +
                                " bytes (" + std::to_string(available_memory_bytes()) +
                                " bytes available on the host)",
                            "reduce the batch size or the model, or free host memory");
  std::lock_guard lock(memory_mutex_);
  live_.emplace(p, bytes);
  current_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, current_bytes_);
  return p;
}

void CpuBackend::deallocate(void* ptr) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard lock(memory_mutex_);
  const auto it = live_.find(ptr);
  if (it == live_.end()) return;  // not ours (or freed twice): never free what we did not allocate
  current_bytes_ -= it->second;
  live_.erase(it);
  std::free(ptr);
}

sdk::MemoryStats CpuBackend::memory_stats() const {
  std::lock_guard lock(memory_mutex_);
  return {current_bytes_, peak_bytes_, live_.size()};
}

void CpuBackend::copy_from_host(TensorView dst, const void* src) {
  require_present("copy_from_host", "dst", dst);
  if (dst.bytes() != 0) std::memcpy(dst.data, src, dst.bytes());
}

void CpuBackend::copy_to_host(void* dst, TensorView src) {
  require_present("copy_to_host", "src", src);
  if (src.bytes() != 0) std::memcpy(dst, src.data, src.bytes());
}

void CpuBackend::copy(TensorView dst, TensorView src) {
  checks().copy_args(dst, src);
  if (dst.bytes() != 0 && dst.data != src.data) std::memmove(dst.data, src.data, dst.bytes());
}

// --- GEMM and cast -----------------------------------------------------------------------------

std::size_t CpuBackend::cached_gemm_primitives() const noexcept {
  return gemm_->cached_primitives();
}
std::string CpuBackend::last_gemm_implementation() const {
  return gemm_->last_implementation();
}

void CpuBackend::gemm(const sdk::GemmArgs& args) {
  use_threads();
  gemm_->run(args,
             [this](sdk::Activation act, const TensorView& z) { activation_forward(act, z, z); });
  account_scratch();
}

std::size_t CpuBackend::cached_dnnl_primitives() const noexcept {
  return prims_->size();
}

void CpuBackend::account_scratch() {
  const std::size_t now = gemm_->scratch_bytes() + prims_->scratch_bytes();
  if (now == scratch_bytes_) return;  // the steady state: scratch is grow-only
  std::lock_guard lock(memory_mutex_);
  current_bytes_ = current_bytes_ - scratch_bytes_ + now;
  scratch_bytes_ = now;
  peak_bytes_ = std::max(peak_bytes_, current_bytes_);
}

namespace {

// Encodes `len` fp32 values (`in`, unscaled) into dst[begin, begin+len) as dst.dtype, x*scale
// rounded once; *amax (when given) receives max|in| with the SDK's NaN rule. `in` may alias the
// destination when both are fp32 storage.
void encode_chunk(const float* in, const TensorView& dst, std::int64_t begin, std::int64_t len,
                  float scale, bool saturate, float* amax) {
  const auto count = static_cast<std::size_t>(len);
  sdk::EncodeOptions options;
  options.scale = scale;
  options.overflow = overflow_rule(saturate);
  options.amax = amax;
  switch (dst.dtype) {
    case DType::bf16:
    case DType::fp16:
      sdk::convert(std::span(in, count), std::span(dst.as<std::uint16_t>() + begin, count),
                   dst.dtype, options);
      return;
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:
      sdk::convert(std::span(in, count), std::span(dst.as<std::uint8_t>() + begin, count),
                   dst.dtype, options);
      return;
    default: {
      if (amax != nullptr) *amax = sdk::abs_max(std::span(in, count));
      float* out = dst.as<float>() + begin;
      if (scale != 1.0f) {
        for (std::size_t i = 0; i < count; ++i) out[i] = in[i] * scale;
      } else if (out != in) {
        std::memmove(out, in, count * sizeof(float));
      }
      if (dst.dtype == DType::tf32) {
        sdk::round_to_tf32(std::span(out, count), options.overflow);
      } else if (saturate) {
        constexpr float kMax = std::numeric_limits<float>::max();
        for (std::size_t i = 0; i < count; ++i)  // NaN compares false: it stays NaN
          out[i] = out[i] > kMax ? kMax : (out[i] < -kMax ? -kMax : out[i]);
      }
      return;
    }
  }
}

}  // namespace

void CpuBackend::cast(TensorView src, TensorView dst, const sdk::CastArgs& args) {
  use_threads();
  checks().cast_args(src, dst, args);
  const bool has_amax = !args.amax.empty();
  const std::int64_t total = src.numel();
  const float scale = args.scale;
  const bool saturate = args.saturate;
  const bool src_fp32 = is_fp32_storage(src.dtype);
  float amax = 0.0f;
  int amax_nan = 0;
#pragma omp parallel for schedule(static) if (parallel_worth(total)) reduction(max     \
                                                                               : amax) \
    reduction(|                                                                        \
              : amax_nan)
  for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, total - c0);
    float in_buf[kChunk];
    const float* in = src_fp32 ? src.as<const float>() + c0 : in_buf;
    if (!src_fp32) decode_into(src, c0, len, in_buf);  // exact: every narrow value is an fp32
    float local = 0.0f;
    encode_chunk(in, dst, c0, len, scale, saturate, has_amax ? &local : nullptr);
    if (local != local)
      amax_nan = 1;
    else
      amax = std::max(amax, local);
  }
  if (has_amax) {
    float& slot = *args.amax.as<float>();
    // NaN propagates so a policy that tracks amax sees the broken tensor.
    if (amax_nan != 0 || std::isnan(slot))
      slot = std::numeric_limits<float>::quiet_NaN();
    else
      slot = std::max(slot, amax);
  }
}

}  // namespace mixtrain::backend_cpu
