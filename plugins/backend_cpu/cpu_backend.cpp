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
#include "cpu_numerics.h"

namespace mixtrain::backend_cpu {

using sdk::DType;
using sdk::TensorView;

CpuBackend::CpuBackend(int threads)
    : threads_(threads > 0 ? threads : std::max(1, omp_get_num_procs())),
      gemm_(std::make_unique<GemmEngine>()),
      eltwise_(std::make_unique<EltwiseEngine>()) {
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
  caps.gemm_inputs.push_back({DType::fp32, true, "oneDNN matmul (" + impl + ")"});
  caps.gemm_inputs.push_back(
      {DType::tf32, false,
       "emulated: A and B rounded to tf32 (RNE, 10 mantissa bits) + oneDNN fp32 matmul"});
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

void CpuBackend::reset_peak_memory() {
  std::lock_guard lock(memory_mutex_);
  peak_bytes_ = current_bytes_;
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
  require_present("copy", "dst", dst);
  require_present("copy", "src", src);
  if (dst.numel() != src.numel() || dtype_size(dst.dtype) != dtype_size(src.dtype) ||
      (dst.dtype != src.dtype && !(is_fp32_storage(dst.dtype) && is_fp32_storage(src.dtype))))
    fail("copy", "dst is " + describe(dst) + " but src is " + describe(src),
         "copy needs the same dtype and element count; use cast() to change dtype");
  if (dst.bytes() != 0 && dst.data != src.data) std::memmove(dst.data, src.data, dst.bytes());
}

// --- GEMM and cast -----------------------------------------------------------------------------

std::size_t CpuBackend::cached_gemm_primitives() const noexcept { return gemm_->cached_primitives(); }

void CpuBackend::gemm(const sdk::GemmArgs& args) {
  use_threads();
  gemm_->run(args);
}

namespace {

bool is_cast_target(DType t) { return is_storage_float(t); }

// Rounds `v` (already scaled) to the destination format and returns it as fp32 value for the
// fp32/tf32 destinations; 16-bit destinations are stored by commit_chunk.
inline float finish_fp32(float v, bool tf32, bool saturate) {
  float r = tf32 ? round_to_tf32(v) : v;
  if (saturate && std::isinf(r) && !std::isnan(v)) {
    constexpr float kMax = std::numeric_limits<float>::max();
    const float max_finite = tf32 ? std::bit_cast<float>(0x7F7FE000u) : kMax;
    r = std::signbit(r) ? -max_finite : max_finite;
  }
  return r;
}

}  // namespace

void CpuBackend::cast(TensorView src, TensorView dst, const sdk::CastArgs& args) {
  use_threads();
  require_present("cast", "src", src);
  require_present("cast", "dst", dst);
  if (is_fp8(src.dtype) || is_fp8(dst.dtype))
    fail("cast",
         "fp8 cast " + std::string(sdk::dtype_name(src.dtype)) + " -> " +
             std::string(sdk::dtype_name(dst.dtype)) + " is not implemented yet",
         "this backend casts between fp32, tf32, bf16 and fp16; fp8 arrives in a later version");
  if (!is_cast_target(src.dtype) || !is_cast_target(dst.dtype))
    fail("cast", "cannot cast " + describe(src) + " to " + describe(dst),
         "cast supports fp32, tf32, bf16 and fp16");
  require_numel("cast", "dst", dst, src.numel());
  const bool has_amax = !args.amax.empty();
  if (has_amax) {
    require_fp32("cast", "amax", args.amax);
    require_numel("cast", "amax", args.amax, 1);
  }
  const std::int64_t total = src.numel();
  const float scale = args.scale;
  const bool saturate = args.saturate;
  const bool to_tf32 = dst.dtype == DType::tf32;
  float amax = 0.0f;
  int amax_nan = 0;
#pragma omp parallel for schedule(static) reduction(max : amax) reduction(| : amax_nan)
  for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, total - c0);
    float in_buf[kChunk];
    float out_buf[kChunk];
    const float* in = read_chunk(src, c0, len, in_buf);
    if (has_amax) {
      float local = 0.0f;
      int nan = 0;
#pragma omp simd reduction(max : local) reduction(| : nan)
      for (std::int64_t i = 0; i < len; ++i) {
        const float a = std::fabs(in[i]);
        local = a > local ? a : local;
        nan |= static_cast<int>(a != a);
      }
      amax = std::max(amax, local);
      amax_nan |= nan;
    }
    if (is_fp32_storage(dst.dtype)) {
      float* out = write_target(dst, c0, out_buf);  // in-place src == dst is fine element-wise
      for (std::int64_t i = 0; i < len; ++i) out[i] = finish_fp32(in[i] * scale, to_tf32, saturate);
    } else {
      for (std::int64_t i = 0; i < len; ++i) out_buf[i] = in[i] * scale;
      commit_chunk(dst, c0, len, out_buf, saturate);
    }
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
