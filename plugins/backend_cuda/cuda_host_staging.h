// HostStaging: pinned buffers through which copy_from_host sends host data to the device.
//
// Why: a cudaMemcpyAsync from pageable memory is staged by the driver and, past its small staging
// buffers, waits for the stream to reach the copy, i.e. for the previous step to finish. The
// trainer uploads a batch every step, so that would be a second host wait per step. Staged here,
// the host writes into a pinned slot, the DMA runs in stream order, and the caller's buffer is
// free on return; reusing a slot waits only for that slot's own earlier DMA (an event), so the
// host can run a step ahead of the device.
//
// A source inside one of the host_memory facet's page-locked buffers (`pinned`, the facet's
// registry) needs no slot: the DMA reads it in place, and the buffer's event marks the read
// (sdk/backend_host_memory.h: the host waits for it before writing the buffer again).
//
// Contract
// - copy(dst, src, bytes, stream, op): dst is device memory. A src inside a registered buffer is
//   read in stream order, after return, and its block marked (PinnedBlock::mark_read); any other
//   src is read before return. Copies larger than kMaxStaged bytes from elsewhere go through the
//   driver's pageable path instead.
// - kSlots slots rotate; each grows (never shrinks) to the largest copy it carried. Pinned host
//   memory is not device memory: it is not in memory_stats().
// - release() waits for in-flight copies and frees everything; call it before the stream goes.
// - Errors: BackendError naming `op` and the CUDA call, or the recording (set_recording). One host
//   thread at a time, except `pinned`, which buffers join and leave from any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cuda_address_ranges.h"
#include "cuda_pinned_block.h"

namespace mixtrain::backend_cuda {

class HostStaging {
 public:
  static constexpr int kSlots = 4;  // a step's input and labels, twice: one step of run-ahead
  static constexpr std::size_t kMaxStaged = std::size_t{64} << 20;

  HostStaging() = default;
  ~HostStaging() { release(); }
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  void copy(void* dst, const void* src, std::size_t bytes, cudaStream_t stream, const char* op);
  // While the stream records a step graph, copy() raises BackendError instead (the step-graph
  // facet's rule: a host upload cannot be recorded).
  void set_recording(bool on) noexcept { recording_ = on; }
  // That BackendError, for an upload that does not go through copy() alone (decode_images).
  void require_not_recording(const char* op) const;
  void release() noexcept;

  // The host_memory facet's buffers (cuda_host_memory_facet.cpp registers them).
  AddressRanges<PinnedBlock> pinned;

 private:
  struct Slot {
    void* host = nullptr;
    std::size_t capacity = 0;
    cudaEvent_t done = nullptr;
    bool in_flight = false;
  };
  Slot slots_[kSlots];
  int next_ = 0;
  bool recording_ = false;
};

}  // namespace mixtrain::backend_cuda
