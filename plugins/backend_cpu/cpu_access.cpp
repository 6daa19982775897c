#include "cpu_access.h"

#include <algorithm>
#include <cstdint>
#include <span>

namespace mixtrain::backend_cpu {

const sdk::BackendArgumentChecks& checks() {
  static const sdk::BackendArgumentChecks instance("backend_cpu");
  return instance;
}

void fail(std::string_view op, const std::string& what, std::string hint) {
  checks().fail(op, what, std::move(hint));
}

void require_bytes(std::string_view op, std::string_view name, const sdk::TensorView& v,
                   std::size_t bytes, const std::string& hint) {
  if (v.bytes() < bytes)
    fail(op,
         std::string(name) + " is " + describe(v) + " (" + std::to_string(v.bytes()) +
             " bytes) but " + std::to_string(bytes) + " bytes are needed",
         hint);
}

void require_at_least(std::string_view op, const std::string& name, std::int64_t value,
                      std::int64_t lo, const std::string& hint) {
  if (value < lo)
    fail(op, name + " = " + std::to_string(value) + " must be at least " + std::to_string(lo),
         hint);
}

void require_present(std::string_view op, std::string_view name, const sdk::TensorView& v) {
  checks().require_present(op, name, v);
}

void require_storage(std::string_view op, std::string_view name, const sdk::TensorView& v) {
  checks().require_storage(op, name, v);
}

void require_fp32(std::string_view op, std::string_view name, const sdk::TensorView& v) {
  checks().require_fp32(op, name, v);
}

void require_numel(std::string_view op, std::string_view name, const sdk::TensorView& v,
                   std::int64_t numel) {
  checks().require_numel(op, name, v, numel);
}

void require_same_or_disjoint(std::string_view op, std::string_view a_name,
                              const sdk::TensorView& a, std::string_view b_name,
                              const sdk::TensorView& b) {
  if (a.data == b.data && a.dtype == b.dtype && a.numel() == b.numel()) return;
  if (overlaps(a, b))
    fail(op,
         std::string(a_name) + " " + describe(a) + " and " + std::string(b_name) + " " +
             describe(b) + " partly overlap",
         "pass the same tensor for both (in place) or separate buffers");
}

std::int64_t checked_product(std::string_view op, std::string_view what,
                             std::initializer_list<std::int64_t> dims) {
  std::int64_t n = 1;
  for (std::int64_t d : dims)
    if (__builtin_mul_overflow(n, d, &n))
      fail(op, std::string(what) + " has more elements than fit in 64 bits",
           "check the layout's dimensions");
  return n;
}

void decode_tensor(const sdk::TensorView& v, float scale_inv, bool tf32, float* dst,
                   std::int64_t n) {
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (std::int64_t c0 = 0; c0 < n; c0 += kDecodeChunk) {
    const std::int64_t len = std::min(kDecodeChunk, n - c0);
    decode_into(v, c0, len, dst + c0, scale_inv);
    if (tf32) sdk::round_to_tf32(std::span(dst + c0, static_cast<std::size_t>(len)));
  }
}

void encode_tensor(const sdk::TensorView& v, const float* src, std::int64_t n) {
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (std::int64_t c0 = 0; c0 < n; c0 += kDecodeChunk)
    commit_chunk(v, c0, std::min(kDecodeChunk, n - c0), src + c0);
}

}  // namespace mixtrain::backend_cpu
