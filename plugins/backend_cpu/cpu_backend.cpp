// CpuBackend: construction, capabilities, copies, cast, fill and the diagnostics. Memory and the
// shared engines are the context's (cpu_context.cpp), the facets are facets/*.cpp.
#include "cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu_access.h"
#include "cpu_features.h"
#include "cpu_gemm.h"
#include "cpu_primitive_cache.h"
#include "cpu_sum_of_squares.h"
#include "mixtrain/sdk/support/backend_features.h"
#include "mixtrain/sdk/support/float_format_rules.h"

namespace mixtrain::backend_cpu {

using sdk::DType;
using sdk::TensorView;

CpuBackend::CpuBackend(int threads, Bf16GemmPath bf16_gemm, Bf16ConvPath bf16_conv,
                       ConvAlgorithm conv_algorithm)
    : context_(threads, bf16_gemm, bf16_conv, conv_algorithm) {}

CpuBackend::~CpuBackend() = default;

void CpuBackend::flush_denormals() {
  if (flush_) return;
  if (!DenormalFlush::supported())
    throw sdk::BackendError(
        "backend_cpu: flush_denormals: this CPU has no flush-to-zero mode the "
        "backend can set (x86's MXCSR)",
        "remove flush_denormals from [backend.cpu]");
  flush_ = std::make_unique<DenormalFlush>(threads());
}

sdk::BackendCapabilities CpuBackend::capabilities() const {
  // Read once: the host asks at every allocation (a linear's choice of epilogues among them), and
  // the model name and memory come from /proc.
  static const CpuInfo cpu = detect_cpu();
  sdk::BackendCapabilities caps;
  caps.kind = "cpu";
  const int threads = context_.threads();
  caps.device_name =
      cpu.model_name + " (" + std::to_string(threads) + (threads == 1 ? " thread)" : " threads)");
  caps.memory_bytes = cpu.memory_bytes;
  caps.threads = threads;
  caps.features = cpu.features;
  // oneDNN's GEMMs block by cache: a few hundred rows run at full rate, and the chunked loss's
  // smaller blocks shrink the logits and the GEMMs' fp32 copies of them (backend_features.h).
  caps.features.emplace_back(sdk::kFeatureGemmFullRateAtFewRows);
  context_.use_threads();
  const std::string impl = context_.gemm().fp32_implementation();
  const std::string fp32_gemm = "oneDNN fp32 matmul (" + impl + ")";
  caps.gemm_inputs.push_back({DType::fp32, true, "oneDNN matmul (" + impl + ")"});
  caps.gemm_inputs.push_back(
      {DType::tf32, false,
       "emulated: A and B rounded to tf32 (RNE, 10 mantissa bits) + " + fp32_gemm});
  const std::string bf16_impl = context_.gemm().bf16_implementation();
  if (context_.gemm().bf16_native()) {
    // A native bf16 GEMM writes a bf16 C itself; a gelu epilogue needs its product in FP32 first
    // (cpu_gemm.h), which costs more than the activation facet's own pass (backend_features.h).
    caps.features.emplace_back(sdk::kFeatureGemmBf16GeluUnfused);
    caps.gemm_inputs.push_back({DType::bf16, true,
                                "oneDNN bf16 matmul (" + bf16_impl + "), fp32 accumulation (" +
                                    context_.gemm().bf16_note() + ")"});
  } else {
    caps.gemm_inputs.push_back({DType::bf16, false,
                                "emulated: exact bf16 -> fp32 decode + " + fp32_gemm + " (" +
                                    context_.gemm().bf16_note() + ")"});
  }
  caps.gemm_inputs.push_back(
      {DType::fp16, false, "emulated: exact fp16 -> fp32 decode + " + fp32_gemm});
  for (DType t : {DType::fp8_e4m3, DType::fp8_e5m2})
    caps.gemm_inputs.push_back({t, false,
                                "emulated: exact " + std::string(sdk::dtype_name(t)) +
                                    " decode (codes; scale_inv joins alpha) + " + fp32_gemm});
  return caps;
}

// --- copies -----------------------------------------------------------------------------------

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

// --- diagnostics -------------------------------------------------------------------------------

std::size_t CpuBackend::cached_gemm_primitives() const noexcept {
  return context_.gemm().cached_primitives();
}
bool CpuBackend::bf16_gemm_native() const {
  return context_.gemm().bf16_native();
}

std::string CpuBackend::last_gemm_implementation() const {
  return context_.gemm().last_implementation();
}
std::size_t CpuBackend::cached_dnnl_primitives() const noexcept {
  return context_.prims().size();
}
double CpuBackend::sum_of_squares(std::span<const TensorView> tensors) const {
  return backend_cpu::sum_of_squares(context_, tensors);
}

// --- cast and fill -----------------------------------------------------------------------------

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
  context_.use_threads();
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
  if (has_amax) fold_amax(args.amax, amax, amax_nan != 0);
}

void CpuBackend::fill(TensorView x, float value) {
  context_.use_threads();
  require_present("fill", "x", x);
  const std::int64_t total = x.numel();
  if (x.dtype == DType::int32) {
    auto* p = x.as<std::int32_t>();
    // Toward zero, saturating, NaN -> 0, as the CUDA backend's fill (a plain cast is undefined
    // out of range).
    const std::int32_t v = sdk::format_rules::int32_toward_zero(value);
#pragma omp parallel for simd schedule(static) if (parallel_worth(total))
    for (std::int64_t i = 0; i < total; ++i) p[i] = v;
    return;
  }
  require_storage("fill", "x", x);
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, total - c0);
    float buf[kChunk];
    float* out = write_target(x, c0, buf);
    for (std::int64_t i = 0; i < len; ++i) out[i] = value;
    commit_chunk(x, c0, len, out);
  }
}

}  // namespace mixtrain::backend_cpu
