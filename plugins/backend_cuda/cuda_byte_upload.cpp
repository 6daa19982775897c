// ByteUpload: a copy stream and two device slots, ordered by events (contract in the header).
#include "cuda_byte_upload.h"

#include "cuda_access.h"

namespace mixtrain::backend_cuda {

ByteUpload::ByteUpload(const std::function<void()>& on_out_of_memory, const char* op) {
  try {
    check_cuda(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), op,
               "cudaStreamCreateWithFlags of the copy stream");
    for (Slot& slot : slots_) {
      slot.bytes.set_out_of_memory_hook(on_out_of_memory);
      check_cuda(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming), op,
                 "cudaEventCreateWithFlags");
      check_cuda(cudaEventCreateWithFlags(&slot.read, cudaEventDisableTiming), op,
                 "cudaEventCreateWithFlags");
    }
  } catch (...) {
    release();
    throw;
  }
}

ByteUpload::~ByteUpload() {
  release();
}

void ByteUpload::release() noexcept {
  // The copy stream may still write a slot (or read a staging slot): wait for it first.
  if (copy_ != nullptr) cudaStreamSynchronize(copy_);
  for (Slot& slot : slots_) {
    if (slot.copied != nullptr) cudaEventDestroy(slot.copied);
    if (slot.read != nullptr) cudaEventDestroy(slot.read);
    slot.copied = slot.read = nullptr;
  }
  if (copy_ != nullptr) cudaStreamDestroy(copy_);
  copy_ = nullptr;
  // The slots' device memory goes with their DeviceScratch (cudaFree waits for the device).
}

const std::uint8_t* ByteUpload::upload(const void* src, std::size_t bytes, HostStaging& staging,
                                       cudaStream_t compute, const char* op) {
  const int s = (last_ + 1) % kSlots;
  Slot& slot = slots_[s];
  if (slot.bytes.capacity() < bytes)
    // Growing frees the old buffer once the compute stream (its decodes) is idle; its copy runs
    // on the copy stream, so that one is waited for here.
    check_cuda(cudaStreamSynchronize(copy_), op, "cudaStreamSynchronize of the copy stream");
  void* dst = slot.bytes.get(bytes, compute, op);
  // The copy overwrites the slot only once the last decode that read it has run (an event never
  // recorded, before this slot's first decode, is no wait).
  check_cuda(cudaStreamWaitEvent(copy_, slot.read, 0), op,
             "cudaStreamWaitEvent on the copy stream");
  staging.copy(dst, src, bytes, copy_, op);
  check_cuda(cudaEventRecord(slot.copied, copy_), op, "cudaEventRecord on the copy stream");
  // The compute stream's next work (the decode) runs once the bytes have arrived.
  check_cuda(cudaStreamWaitEvent(compute, slot.copied, 0), op, "cudaStreamWaitEvent on the stream");
  last_ = s;
  return static_cast<const std::uint8_t*>(dst);
}

void ByteUpload::consumed(cudaStream_t compute, const char* op) {
  check_cuda(cudaEventRecord(slots_[last_].read, compute), op, "cudaEventRecord on the stream");
}

std::size_t ByteUpload::device_bytes() const {
  std::size_t total = 0;
  for (const Slot& slot : slots_) total += slot.bytes.capacity();
  return total;
}

}  // namespace mixtrain::backend_cuda
