// Validation and storage-dtype access helpers shared by the CPU kernels.
//
// Contract
// - fail()/require_*() throw sdk::BackendError whose message names "backend_cpu.<op>", the
//   tensor, its dtype and shape, and whose hint says how to fix the call.
// - Storage dtypes are fp32 (tf32 views are fp32 storage), bf16 and fp16. read_chunk() returns
//   fp32 values of elements [begin, begin+n): a pointer into the tensor itself for fp32 storage
//   (no copy), else `buf` filled by conversion. write_target()/commit_chunk() do the same for
//   outputs, rounding RNE. Chunks are at most kChunk elements, so buffers live on the stack.
// - Every conversion is sdk/float_formats.h's bulk convert(): the one definition of each format
//   in the project, vectorised with the widest ISA the CPU has (checked at run time).
// - fp8 storage (fp8_e4m3 / fp8_e5m2) is accepted only by gemm(), cast() and cast_transpose().
#pragma once

#include "mixtrain/sdk/support/backend_argument_checks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::backend_cpu {

inline constexpr std::int64_t kChunk = 2048;

// The SDK's shared checks, with this backend's name in every message.
const sdk::BackendArgumentChecks& checks();
[[noreturn]] void fail(std::string_view op, const std::string& what, std::string hint = {});
using sdk::describe;  // "bf16 [512, 1024]"
using sdk::is_fp32_storage;
using sdk::is_storage_float;
using sdk::overlaps;

void require_present(std::string_view op, std::string_view name, const sdk::TensorView& v);
// fp32, bf16 or fp16 storage.
void require_storage(std::string_view op, std::string_view name, const sdk::TensorView& v);
void require_fp32(std::string_view op, std::string_view name, const sdk::TensorView& v);
void require_numel(std::string_view op, std::string_view name, const sdk::TensorView& v,
                   std::int64_t numel);

// Elements of work below which a kernel runs on the calling thread: waking the OpenMP team
// costs a few microseconds, more than a 128x128 element-wise pass takes on one core.
inline constexpr std::int64_t kParallelMin = 32768;
inline bool parallel_worth(std::int64_t work) {
  return work >= kParallelMin;
}

inline sdk::Overflow overflow_rule(bool saturate) {
  return saturate ? sdk::Overflow::saturate : sdk::Overflow::to_inf_or_nan;
}

// Folds one pass's amax into the fp32 [1] `slot` by cast's rule: `amax` is max |x| over what the
// pass saw, `nan` whether it saw a NaN. NaN propagates (from the pass or already in the slot), so
// a policy that tracks amax sees the broken tensor.
inline void fold_amax(const sdk::TensorView& slot, float amax, bool nan) {
  float& s = *slot.as<float>();
  s = nan || std::isnan(s) ? std::numeric_limits<float>::quiet_NaN() : std::max(s, amax);
}

inline const float* read_chunk(const sdk::TensorView& v, std::int64_t begin, std::int64_t n,
                               float* buf) {
  switch (v.dtype) {
    case sdk::DType::bf16:
    case sdk::DType::fp16:
      sdk::convert(
          std::span(static_cast<const std::uint16_t*>(v.data) + begin, static_cast<std::size_t>(n)),
          v.dtype, std::span(buf, static_cast<std::size_t>(n)));
      return buf;
    default:
      return static_cast<const float*>(v.data) + begin;
  }
}

// Any float storage (fp32, tf32, bf16, fp16, fp8) -> exact fp32 values times scale_inv in `dst`.
inline void decode_into(const sdk::TensorView& v, std::int64_t begin, std::int64_t n, float* dst,
                        float scale_inv = 1.0f) {
  const auto count = static_cast<std::size_t>(n);
  switch (v.dtype) {
    case sdk::DType::bf16:
    case sdk::DType::fp16:
      sdk::convert(std::span(static_cast<const std::uint16_t*>(v.data) + begin, count), v.dtype,
                   std::span(dst, count), scale_inv);
      return;
    case sdk::DType::fp8_e4m3:
    case sdk::DType::fp8_e5m2:
      sdk::convert(std::span(static_cast<const std::uint8_t*>(v.data) + begin, count), v.dtype,
                   std::span(dst, count), scale_inv);
      return;
    default: {
      const float* src = static_cast<const float*>(v.data) + begin;
      if (scale_inv == 1.0f) {
        if (src != dst) std::memmove(dst, src, count * sizeof(float));
      } else {
        for (std::size_t i = 0; i < count; ++i) dst[i] = src[i] * scale_inv;
      }
      return;
    }
  }
}

// Whole-tensor passes work in chunks of this many elements: large enough that a chunk amortises
// the bulk converter's dispatch, small enough to spread over the OpenMP team.
inline constexpr std::int64_t kDecodeChunk = 1 << 14;

// dst[0, n) = the exact fp32 values of v[0, n) (any float storage, fp8 included) times
// scale_inv, then rounded to tf32 (RNE) when `tf32`; OpenMP over chunks when worth it.
void decode_tensor(const sdk::TensorView& v, float scale_inv, bool tf32, float* dst,
                   std::int64_t n);
// v[0, n) = src[0, n) rounded once (RNE) into v's storage dtype; OpenMP over chunks. `src` may be
// v's own data when v is fp32 storage.
void encode_tensor(const sdk::TensorView& v, const float* src, std::int64_t n);

inline float* write_target(const sdk::TensorView& v, std::int64_t begin, float* buf) {
  return is_fp32_storage(v.dtype) ? static_cast<float*>(v.data) + begin : buf;
}

inline void commit_chunk(const sdk::TensorView& v, std::int64_t begin, std::int64_t n,
                         const float* values, bool saturate = false) {
  switch (v.dtype) {
    case sdk::DType::bf16:
    case sdk::DType::fp16: {
      sdk::EncodeOptions options;
      options.overflow = overflow_rule(saturate);
      sdk::convert(
          std::span(values, static_cast<std::size_t>(n)),
          std::span(static_cast<std::uint16_t*>(v.data) + begin, static_cast<std::size_t>(n)),
          v.dtype, options);
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

// Whole rows of [rows, n] tensors (layer norm, the loss): the same rules a row at a time.
// fp32 view of a whole row [n]: the row itself for fp32 storage, else converted into `buf`.
inline const float* read_row(const sdk::TensorView& v, std::int64_t row, std::int64_t n,
                             std::vector<float>& buf) {
  if (is_fp32_storage(v.dtype)) return v.as<const float>() + row * n;
  buf.resize(static_cast<std::size_t>(n));
  for (std::int64_t c0 = 0; c0 < n; c0 += kChunk)
    read_chunk(v, row * n + c0, std::min(kChunk, n - c0), buf.data() + c0);
  return buf.data();
}

inline float* row_target(const sdk::TensorView& v, std::int64_t row, std::int64_t n,
                         std::vector<float>& buf) {
  if (is_fp32_storage(v.dtype)) return v.as<float>() + row * n;
  buf.resize(static_cast<std::size_t>(n));
  return buf.data();
}

inline void commit_row(const sdk::TensorView& v, std::int64_t row, std::int64_t n,
                       const float* values) {
  if (is_fp32_storage(v.dtype)) return;  // written in place
  commit_chunk(v, row * n, n, values);
}

// Elements [begin, begin + n) of v as a 1-D view of v's dtype (an empty v stays empty).
inline sdk::TensorView element_range(const sdk::TensorView& v, std::int64_t begin, std::int64_t n) {
  if (v.empty()) return v;
  return {static_cast<char*>(v.data) + begin * static_cast<std::int64_t>(sdk::dtype_size(v.dtype)),
          v.dtype, sdk::Shape{n}};
}

// dst[d_at, d_at + n) = src[s_at, s_at + n) for any two storage dtypes: a memcpy when they
// store alike, else an exact decode and one RNE encode.
inline void copy_elements(const sdk::TensorView& src, std::int64_t s_at, const sdk::TensorView& dst,
                          std::int64_t d_at, std::int64_t n) {
  if (src.dtype == dst.dtype || (is_fp32_storage(src.dtype) && is_fp32_storage(dst.dtype))) {
    const auto size = static_cast<std::int64_t>(sdk::dtype_size(src.dtype));
    std::memcpy(static_cast<char*>(dst.data) + d_at * size,
                static_cast<const char*>(src.data) + s_at * size,
                static_cast<std::size_t>(n * size));
    return;
  }
  for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, n - c0);
    float buf[kChunk];
    commit_chunk(dst, d_at + c0, len, read_chunk(src, s_at + c0, len, buf));
  }
}

}  // namespace mixtrain::backend_cpu
