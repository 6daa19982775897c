// DeviceScratch: a grow-only device buffer for an op's temporaries (converted GEMM operands,
// partial sums, multi-tensor tables).
//
// Contract: get(bytes) returns at least `bytes` of device memory valid until the next get() that
// grows it. Growing synchronises `stream` before freeing the old buffer (earlier ops may still read
// it); steady state does no allocation; release() gives it back. capacity() feeds the backend's
// memory statistics. When cudaMalloc runs out of memory, the out-of-memory hook (if set: the
// backend's allocator giving its cached blocks back) runs once and the allocation is retried
// before the error is raised; its message names the buffer and the fix the caller gives. A request
// past SIZE_MAX - 255 bytes (or, through as(), whose count times the element size overflows) raises
// BackendError before any CUDA call.
// - Recorded step graphs (cuda_step_graph_facet.cpp) hold this buffer's address in their kernels'
//   arguments. While the counter given to set_graph_guard() is > 0, growth and release() retire
//   the old buffer instead of freeing it (a replay still reads and writes it); retired buffers are
//   freed by free_retired() (the owner, when its last graph goes), at the first growth or
//   release() with no graph alive, and by the destructor.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_access.h"

namespace mixtrain::backend_cuda {

class DeviceScratch {
 public:
  DeviceScratch() = default;
  ~DeviceScratch() {
    if (data_ != nullptr) cudaFree(data_);
    for (void* p : retired_) cudaFree(p);
  }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  // `buffer` and `fix` name the buffer and the remedy in the out-of-memory message.
  void* get(std::size_t bytes, cudaStream_t stream, const char* op,
            std::string_view buffer = "scratch",
            std::string_view fix = "reduce the batch size or the model, or free device memory") {
    if (bytes <= capacity_ && data_ != nullptr) return data_;
    // Rounding up must not wrap to a small buffer that the caller then overruns.
    if (bytes > std::numeric_limits<std::size_t>::max() - 255) too_large(op, buffer, fix);
    const std::size_t rounded = std::max<std::size_t>(256, (bytes + 255) / 256 * 256);
    if (data_ != nullptr) {
      if (graphs_alive()) {
        retired_.push_back(data_);  // a recorded graph's kernels point into it
      } else {
        check_cuda(cudaStreamSynchronize(stream), op, "cudaStreamSynchronize");
        cudaFree(data_);
        free_retired();
      }
      data_ = nullptr;
      capacity_ = 0;
    }
    cudaError_t status = cudaMalloc(&data_, rounded);
    if (status == cudaErrorMemoryAllocation && on_out_of_memory_) {
      (void)cudaGetLastError();
      data_ = nullptr;
      on_out_of_memory_();
      status = cudaMalloc(&data_, rounded);
    }
    if (status != cudaSuccess) {
      data_ = nullptr;
      std::size_t free_bytes = 0, total_bytes = 0;
      (void)cudaGetLastError();
      cudaMemGetInfo(&free_bytes, &total_bytes);
      fail(op,
           "cannot allocate " + std::to_string(rounded) + " bytes of " + std::string(buffer) +
               " (" + cuda_error_text(status) + "); the device reports " +
               std::to_string(free_bytes) + " bytes free of " + std::to_string(total_bytes),
           std::string(fix));
    }
    capacity_ = rounded;
    return data_;
  }
  template <class T>
  T* as(std::size_t count, cudaStream_t stream, const char* op) {
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(T))
      too_large(op, "scratch", "reduce the batch size or the model");
    return static_cast<T*>(get(count * sizeof(T), stream, op));
  }
  std::size_t capacity() const { return capacity_; }
  // Frees the buffer after `stream`'s work (which may still read it) is done.
  void release(cudaStream_t stream) noexcept {
    if (data_ == nullptr) return;
    if (graphs_alive()) {
      retired_.push_back(data_);
    } else {
      cudaStreamSynchronize(stream);
      cudaFree(data_);
      free_retired();
    }
    data_ = nullptr;
    capacity_ = 0;
  }
  void set_out_of_memory_hook(std::function<void()> hook) { on_out_of_memory_ = std::move(hook); }
  // live_graphs: the owner's count of recorded graphs not yet released (outlives this scratch).
  void set_graph_guard(const int* live_graphs) { live_graphs_ = live_graphs; }
  // Frees the retired buffers; only once the stream is idle and no graph can replay.
  void free_retired() noexcept {
    for (void* p : retired_) cudaFree(p);
    retired_.clear();
  }

 private:
  [[noreturn]] static void too_large(const char* op, std::string_view buffer,
                                     std::string_view fix) {
    fail(op,
         "a request for " + std::string(buffer) +
             " is past the range of a byte count (a size computed from the shapes overflowed)",
         std::string(fix));
  }
  bool graphs_alive() const { return live_graphs_ != nullptr && *live_graphs_ > 0; }

  std::function<void()> on_out_of_memory_;
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
  const int* live_graphs_ = nullptr;
  std::vector<void*> retired_;  // outgrown while a graph was alive
};

}  // namespace mixtrain::backend_cuda
