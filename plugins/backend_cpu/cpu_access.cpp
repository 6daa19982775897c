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
