// GemmEngine: C = alpha*op(A)*op(B) + beta*C (+ bias) through cached oneDNN matmul primitives.
//
// Contract
// - Inputs are validated by the engine (dtypes, shapes) and errors are sdk::BackendError.
// - One primitive per (m, n, k, transposes, A/B/C dtypes, has-bias, alpha != 1, beta) is created
//   on first use and reused; alpha is a run-time output scale, beta a sum post-op, bias the
//   matmul bias argument (oneDNN scales that by alpha, so with alpha != 1 the bias is a binary-add
//   post-op after the sum instead). Transposes are memory-descriptor strides: A and B are never copied
//   for fp32. tf32 inputs are rounded (RNE, 10 mantissa bits) into scratch owned by the engine.
// - Input dtypes are resolved by prepare_operands(): adding bf16/fp16/fp8 means one more case
//   there (convert or pass through natively) and nothing else changes.
// - Not thread-safe: one engine per backend, used by one host thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>

#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::backend_cpu {

// Grow-only 64-byte aligned scratch.
class ScratchBuffer {
 public:
  void* get(std::size_t bytes);
  template <class T>
  T* as(std::size_t count) {
    return static_cast<T*>(get(count * sizeof(T)));
  }

 private:
  struct Free {
    void operator()(void* p) const noexcept;
  };
  std::unique_ptr<void, Free> data_;
  std::size_t capacity_ = 0;
};

class GemmEngine {
 public:
  GemmEngine();
  ~GemmEngine();

  void run(const sdk::GemmArgs& args);

  // Implementation oneDNN picks for an fp32 GEMM on this CPU (for capabilities()).
  std::string fp32_implementation();
  std::size_t cached_primitives() const { return cache_.size(); }

 private:
  struct Key {
    std::int64_t m, n, k;
    bool trans_a, trans_b, has_bias, has_alpha;
    dnnl::memory::data_type a_dt, b_dt, c_dt;
    std::uint32_t beta_bits;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& key) const noexcept;
  };
  struct Entry {
    dnnl::matmul primitive;
    dnnl::memory::desc a_md, b_md, c_md, bias_md;
    bool c_via_fp32 = false;  // oneDNN cannot write this C dtype directly: fp32 scratch + cast
    int bias_arg = DNNL_ARG_BIAS;  // or a binary post-op's SRC_1 when alpha must not scale it
    std::string implementation;  // oneDNN's impl_info_str(), e.g. "brg:avx512_core"
  };
  // Operands as they enter oneDNN: possibly rounded copies of A and B.
  struct Operands {
    const void* a;
    const void* b;
    dnnl::memory::data_type a_dt, b_dt;
  };

  Operands prepare_operands(const sdk::GemmArgs& args, std::int64_t a_numel,
                            std::int64_t b_numel);
  Entry& entry_for(const Key& key);
  Entry create_entry(const Key& key, dnnl::memory::data_type c_dt) const;

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::unordered_map<Key, Entry, KeyHash> cache_;
  ScratchBuffer scratch_a_, scratch_b_, scratch_c_;
};

}  // namespace mixtrain::backend_cpu
