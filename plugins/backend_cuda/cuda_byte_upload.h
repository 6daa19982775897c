// ByteUpload: host bytes carried to the device on a copy stream of their own into one of two
// device slots, ordered against the compute stream by events: the image_input facet's upload of a
// batch of byte images (cuda_image_input_facet.cpp).
//
// Why: the batch is the one large upload of a step. On the compute stream its copy would queue
// behind the previous step's kernels and the next decode behind the copy; on a stream of its own
// the copy of batch n+1 overlaps the compute stream's work on batch n. Two slots make that safe:
// batch n+1 lands in the slot batch n's decode does not read, and the copy into a slot waits, on
// the device (an event), only for the last decode that read that slot. The bytes go through the
// context's pinned staging slots (cuda_host_staging.h), so the caller's buffer is free when
// upload() returns and the host never waits for the compute stream; bytes already in a
// host_memory buffer are read in place instead (HostStaging::copy).
//
// Contract
// - upload(src, bytes, staging, compute, op): returns device memory holding a copy of src's
//   bytes, 256-byte aligned, which the compute stream's next work sees (the compute stream waits
//   on the copy's event); src is read as HostStaging::copy reads it. The memory stays valid until
//   the upload after next; call consumed(compute, op) once every kernel reading it is enqueued on
//   the compute stream, so that the slot's next copy waits for them.
// - Slots grow only, each to the largest batch it carried; device_bytes() is their sum, which
//   CudaContext::account_buffers() folds into the memory statistics. A slot grows only after both
//   streams finished with it (its copy and its decodes).
// - Lifetime: the context makes one on the first decode_images (the copy stream is created then,
//   non-blocking like the compute stream) and destroys it before its staging slots and its
//   compute stream; the destructor waits for the copy stream, then frees slots, events and stream.
// - Not recordable into a step graph (the copy stream is not captured): the caller raises first,
//   HostStaging::require_not_recording.
// - Errors: BackendError naming `op` and the CUDA call. One host thread at a time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "cuda_host_staging.h"
#include "cuda_scratch.h"

namespace mixtrain::backend_cuda {

class ByteUpload {
 public:
  static constexpr int kSlots = 2;  // double buffered: one slot copied into, one read

  // on_out_of_memory: the context's hook (give the allocator's cached blocks back) for the slots.
  ByteUpload(const std::function<void()>& on_out_of_memory, const char* op);
  ~ByteUpload();
  ByteUpload(const ByteUpload&) = delete;
  ByteUpload& operator=(const ByteUpload&) = delete;

  const std::uint8_t* upload(const void* src, std::size_t bytes, HostStaging& staging,
                             cudaStream_t compute, const char* op);
  void consumed(cudaStream_t compute, const char* op);
  std::size_t device_bytes() const;

 private:
  struct Slot {
    DeviceScratch bytes;
    cudaEvent_t copied = nullptr;  // on the copy stream, after the copy into this slot
    cudaEvent_t read = nullptr;    // on the compute stream, after the last decode of this slot
  };
  void release() noexcept;

  cudaStream_t copy_ = nullptr;
  Slot slots_[kSlots];
  int last_ = kSlots - 1;  // the slot the last upload filled
};

}  // namespace mixtrain::backend_cuda
