// PinnedBlock (cuda_pinned_block.h): a page-locked host block and its last upload's event.
#include "cuda_pinned_block.h"

#include <string>

#include "cuda_access.h"

namespace mixtrain::backend_cuda {

namespace {

constexpr const char* kOp = "allocate_host";

void use_device(int device) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device)
    check_cuda(cudaSetDevice(device), kOp, "cudaSetDevice");
}

}  // namespace

PinnedBlock::PinnedBlock(std::size_t bytes, int device) : device_(device), bytes_(bytes) {
  use_device(device_);
  void* host = nullptr;
  const cudaError_t allocated = cudaHostAlloc(&host, bytes, cudaHostAllocDefault);
  if (allocated != cudaSuccess) {
    (void)cudaGetLastError();
    // Page-locked memory is the OS's to give: RLIMIT_MEMLOCK, or what the machine can spare.
    fail(kOp,
         "cudaHostAlloc of " + std::to_string(bytes) +
             " bytes of page-locked host memory failed: " + cuda_error_text(allocated),
         "set data.pin_memory = false, lower data.batch_size, or raise the locked-memory limit "
         "(ulimit -l)");
  }
  host_ = static_cast<std::byte*>(host);
  // Blocking: the waiter is mostly the loader thread (the next batch's block), which would
  // otherwise spin a core beside the training thread until the last copy out of it ends.
  const cudaError_t created =
      cudaEventCreateWithFlags(&read_, cudaEventDisableTiming | cudaEventBlockingSync);
  if (created != cudaSuccess) {
    cudaFreeHost(host_);
    host_ = nullptr;
    check_cuda(created, kOp, "cudaEventCreateWithFlags");
  }
}

PinnedBlock::~PinnedBlock() {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device_) cudaSetDevice(device_);
  if (queued_.load()) cudaEventSynchronize(read_);
  if (read_ != nullptr) cudaEventDestroy(read_);
  if (host_ != nullptr) cudaFreeHost(host_);
}

void PinnedBlock::mark_read(cudaStream_t stream, const char* op) {
  // One event marks the block: a mark on another stream than the last one must not fire before
  // that earlier upload has read the block, so this stream waits for it first (on the device).
  if (queued_.load() && marked_on_ != stream) {
    const cudaError_t waited = cudaStreamWaitEvent(stream, read_, 0);
    if (waited != cudaSuccess) {
      // This stream's copy is queued but cannot be marked after the earlier one: wait for both
      // now, so that wait_until_read() never returns before either has read the block.
      cudaStreamSynchronize(stream);
      cudaEventSynchronize(read_);
      queued_.store(false);
      check_cuda(waited, op, "cudaStreamWaitEvent");
    }
  }
  marked_on_ = stream;
  const cudaError_t recorded = cudaEventRecord(read_, stream);
  if (recorded != cudaSuccess) {
    // Without the event nothing would tell when the block is free again: wait for the copy now.
    cudaStreamSynchronize(stream);
    queued_.store(false);
    check_cuda(recorded, op, "cudaEventRecord");
  }
  queued_.store(true);
}

void PinnedBlock::wait_until_read() {
  if (!queued_.load()) return;
  use_device(device_);
  check_cuda(cudaEventSynchronize(read_), "wait_until_read", "cudaEventSynchronize");
  queued_.store(false);
}

}  // namespace mixtrain::backend_cuda
