// ScratchBuffer: grow-only, 64-byte aligned host scratch, reused across calls (the GEMM's decoded
// operands, the primitive cache's, the eltwise engine's decoded blocks).
//
// Contract
// - get(bytes) returns at least `bytes` (rounded up to 64) of uninitialised memory, valid until
//   the next get() that grows it; a smaller request reuses what is there. capacity() is what is
//   held, which the owners report as scratch (CpuContext::account_scratch).
// - An allocation the host cannot serve throws sdk::BackendError naming the bytes.
// - Not thread-safe: one owner, one host thread at a time.
#pragma once

#include <cstddef>
#include <memory>

namespace mixtrain::backend_cpu {

class ScratchBuffer {
 public:
  void* get(std::size_t bytes);
  std::size_t capacity() const { return capacity_; }
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

}  // namespace mixtrain::backend_cpu
