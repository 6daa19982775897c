#include "cuda_host_staging.h"

#include <cstring>
#include <string>

#include "cuda_access.h"

namespace mixtrain::backend_cuda {

void HostStaging::copy(void* dst, const void* src, std::size_t bytes, cudaStream_t stream,
                       const char* op) {
  if (bytes == 0) return;
  require_not_recording(op);
  if (PinnedBlock* block = pinned.find(src, bytes)) {
    // Already page-locked: the DMA reads the host's buffer in place, in stream order.
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream), op,
               "cudaMemcpyAsync");
    block->mark_read(stream, op);
    return;
  }
  if (bytes > kMaxStaged) {
    // Rare (weights at load time, not a step's batch): the driver's pageable path, which has read
    // `src` when it returns. From page-locked memory outside the registry (another backend's
    // buffer, the caller's own cudaHostAlloc) the copy is a DMA that returns before it reads:
    // wait for it, so the contract holds there too.
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream), op,
               "cudaMemcpyAsync");
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, src) != cudaSuccess) {
      (void)cudaGetLastError();              // not the next op's error
      attributes.type = cudaMemoryTypeHost;  // unknown: wait, to be safe
    }
    if (attributes.type == cudaMemoryTypeHost)
      check_cuda(cudaStreamSynchronize(stream), op, "cudaStreamSynchronize");
    return;
  }
  Slot& slot = slots_[next_];
  next_ = (next_ + 1) % kSlots;
  if (slot.done == nullptr)
    check_cuda(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming), op,
               "cudaEventCreateWithFlags");
  if (slot.in_flight) {
    // Only this slot's earlier DMA, enqueued kSlots copies ago.
    check_cuda(cudaEventSynchronize(slot.done), op, "cudaEventSynchronize");
    slot.in_flight = false;
  }
  if (slot.capacity < bytes) {
    if (slot.host != nullptr) cudaFreeHost(slot.host);
    slot.host = nullptr;
    slot.capacity = 0;
    const std::size_t rounded = (bytes + (std::size_t{64} << 10) - 1) / (std::size_t{64} << 10) *
                                (std::size_t{64} << 10);
    const cudaError_t allocated = cudaMallocHost(&slot.host, rounded);
    if (allocated != cudaSuccess) {
      (void)cudaGetLastError();
      slot.host = nullptr;
      // Page-locked host memory, not device memory: check_cuda's hint would point at the GPU.
      fail(op,
           "cudaMallocHost of " + std::to_string(rounded) +
               " bytes of staging memory (page-locked host memory for uploads) failed: " +
               cuda_error_text(allocated),
           "lower data.batch_size, or raise the locked-memory limit (ulimit -l)");
    }
    slot.capacity = rounded;
  }
  std::memcpy(slot.host, src, bytes);
  check_cuda(cudaMemcpyAsync(dst, slot.host, bytes, cudaMemcpyHostToDevice, stream), op,
             "cudaMemcpyAsync");
  const cudaError_t recorded = cudaEventRecord(slot.done, stream);
  if (recorded != cudaSuccess) {
    // Without the event nothing would tell when the slot is free again: wait for the copy now.
    cudaStreamSynchronize(stream);
    check_cuda(recorded, op, "cudaEventRecord");
  }
  slot.in_flight = true;
}

void HostStaging::require_not_recording(const char* op) const {
  if (recording_)
    // The recorded copy would read the slot at every replay, long after the host reused it.
    fail(op, "a host upload cannot be part of a recorded step graph",
         "run this op outside the recording (the trainer then runs the step op by op)");
}

void HostStaging::release() noexcept {
  for (Slot& slot : slots_) {
    if (slot.in_flight) cudaEventSynchronize(slot.done);
    if (slot.done != nullptr) cudaEventDestroy(slot.done);
    if (slot.host != nullptr) cudaFreeHost(slot.host);
    slot = Slot{};
  }
}

}  // namespace mixtrain::backend_cuda
