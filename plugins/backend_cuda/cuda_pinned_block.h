// PinnedBlock: one page-locked host block of the host_memory facet (sdk/backend_host_memory.h) and
// the event that marks the last upload queued from it, so the host knows when it may write the
// block again without waiting for the whole device.
//
// Contract
// - Construction (on any thread): `bytes` bytes of page-locked memory on `device`'s behalf, 64-byte
//   aligned (cudaHostAlloc gives pages), and an event; throws BackendError naming the block's size,
//   CUDA's error and the fix (data.pin_memory = false, or a higher locked-memory limit).
// - mark_read(stream, op): called right after an upload from the block was queued on `stream`;
//   the block counts as read once the stream passes that point and every earlier mark's point
//   (an upload on another stream: the image input's copy stream, the compute stream's
//   copy_from_host; the new mark waits for the old one on the device). If the mark cannot be
//   recorded the stream is waited for, so the block is never written early, and BackendError is
//   raised.
// - wait_until_read(): blocks until the last marked upload has read the block (no-op without one).
// - Destruction waits the same way, then frees the block (errors are swallowed: a destructor).
// - One thread at a time per block (the host_memory contract: a buffer has one user at a time).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>

namespace mixtrain::backend_cuda {

class PinnedBlock {
 public:
  PinnedBlock(std::size_t bytes, int device);
  ~PinnedBlock();
  PinnedBlock(const PinnedBlock&) = delete;
  PinnedBlock& operator=(const PinnedBlock&) = delete;

  std::byte* data() noexcept { return host_; }
  std::size_t size() const noexcept { return bytes_; }
  void mark_read(cudaStream_t stream, const char* op);
  void wait_until_read();

 private:
  int device_;
  std::size_t bytes_;
  std::byte* host_ = nullptr;
  cudaEvent_t read_ = nullptr;
  cudaStream_t marked_on_ = nullptr;  // the stream of the last mark (while queued_)
  std::atomic<bool> queued_{false};
};

}  // namespace mixtrain::backend_cuda
