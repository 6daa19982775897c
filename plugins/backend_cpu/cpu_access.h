// Validation and storage-dtype access helpers shared by the CPU kernels.
//
// Contract
// - fail()/require_*() throw sdk::BackendError whose message names "backend_cpu.<op>", the
//   tensor, its dtype and shape, and whose hint says how to fix the call.
// - Storage dtypes are fp32 (tf32 views are fp32 storage), bf16 and fp16. read_chunk() returns
//   fp32 values of elements [begin, begin+n): a pointer into the tensor itself for fp32 storage
//   (no copy), else `buf` filled by conversion. write_target()/commit_chunk() do the same for
//   outputs, rounding RNE. Chunks are at most kChunk elements, so buffers live on the stack.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "cpu_numerics.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cpu {

inline constexpr std::int64_t kChunk = 2048;

[[noreturn]] void fail(std::string_view op, const std::string& what, std::string hint = {});
std::string describe(const sdk::TensorView& v);  // "bf16 [512, 1024]"

inline bool is_fp32_storage(sdk::DType t) { return t == sdk::DType::fp32 || t == sdk::DType::tf32; }
inline bool is_storage_float(sdk::DType t) {
  return is_fp32_storage(t) || t == sdk::DType::bf16 || t == sdk::DType::fp16;
}

void require_present(std::string_view op, std::string_view name, const sdk::TensorView& v);
// fp32, bf16 or fp16 storage.
void require_storage(std::string_view op, std::string_view name, const sdk::TensorView& v);
void require_fp32(std::string_view op, std::string_view name, const sdk::TensorView& v);
void require_numel(std::string_view op, std::string_view name, const sdk::TensorView& v,
                   std::int64_t numel);

inline const float* read_chunk(const sdk::TensorView& v, std::int64_t begin, std::int64_t n,
                               float* buf) {
  switch (v.dtype) {
    case sdk::DType::bf16: {
      const auto* src = static_cast<const std::uint16_t*>(v.data) + begin;
      for (std::int64_t i = 0; i < n; ++i) buf[i] = bf16_to_float(src[i]);
      return buf;
    }
    case sdk::DType::fp16: {
      const auto* src = static_cast<const std::uint16_t*>(v.data) + begin;
      for (std::int64_t i = 0; i < n; ++i) buf[i] = fp16_to_float(src[i]);
      return buf;
    }
    default:
      return static_cast<const float*>(v.data) + begin;
  }
}

inline float* write_target(const sdk::TensorView& v, std::int64_t begin, float* buf) {
  return is_fp32_storage(v.dtype) ? static_cast<float*>(v.data) + begin : buf;
}

inline void commit_chunk(const sdk::TensorView& v, std::int64_t begin, std::int64_t n,
                         const float* values, bool saturate = false) {
  switch (v.dtype) {
    case sdk::DType::bf16: {
      auto* dst = static_cast<std::uint16_t*>(v.data) + begin;
      for (std::int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(values[i], saturate);
      return;
    }
    case sdk::DType::fp16: {
      auto* dst = static_cast<std::uint16_t*>(v.data) + begin;
      for (std::int64_t i = 0; i < n; ++i) dst[i] = float_to_fp16(values[i], saturate);
      return;
    }
    default: {
      float* dst = static_cast<float*>(v.data) + begin;
      if (dst != values)
        for (std::int64_t i = 0; i < n; ++i) dst[i] = values[i];
      return;
    }
  }
}

}  // namespace mixtrain::backend_cpu
