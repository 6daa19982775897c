#include "cuda_allocator.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <string>

#include "cuda_access.h"

namespace mixtrain::backend_cuda {

namespace {

constexpr std::size_t kMinBlock = 512;
constexpr std::size_t kSmallLimit = std::size_t{1} << 20;
constexpr std::size_t kLargeGranule = std::size_t{2} << 20;

std::string mib(std::size_t bytes) {
  const double m = static_cast<double>(bytes) / (1024.0 * 1024.0);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", m);
  return std::to_string(bytes) + " bytes (" + buf + ")";
}

}  // namespace

std::string CachingAllocator::out_of_memory_text(std::size_t bytes, std::size_t size_class,
                                                 std::size_t allocated, std::size_t reserved,
                                                 std::size_t released, std::size_t free_bytes,
                                                 std::size_t total_bytes) {
  return "out of device memory: asked for " + mib(bytes) + " (a block of " + mib(size_class) +
         ") with " + mib(allocated) + " allocated by this backend (" + mib(reserved) +
         " reserved from the driver; " + mib(released) +
         " of cached free blocks released for a retry); the device reports " + mib(free_bytes) +
         " free of " + mib(total_bytes);
}

CachingAllocator::~CachingAllocator() {
  release_cached();
  for (auto& [ptr, block] : live_) cudaFree(ptr);
  for (auto& [ptr, cls] : retired_) cudaFree(ptr);
}

std::size_t CachingAllocator::size_class(std::size_t bytes) {
  if (bytes <= kMinBlock) return kMinBlock;
  if (bytes <= kSmallLimit) return std::bit_ceil(bytes);
  return (bytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
}

void* CachingAllocator::allocate(std::size_t bytes, const char* op) {
  // Far above any device's memory (and below where size classes would wrap): a negative size
  // converted to size_t, say. Refused with the number rather than rounded into nonsense.
  constexpr std::size_t kLargest = std::size_t{1} << 48;
  if (bytes > kLargest)
    fail(op, "asked for " + std::to_string(bytes) + " bytes, more than any device holds",
         "check the tensor's shape (a negative or overflowed dimension?)");
  const std::size_t cls = size_class(bytes);
  void* ptr = nullptr;
  if (auto it = free_.find(cls); it != free_.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
  } else {
    cudaError_t status = cudaMalloc(&ptr, cls);
    std::size_t released = 0;
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      cudaDeviceSynchronize();  // cached blocks may still be in use by enqueued work
      released = release_cached();
      status = cudaMalloc(&ptr, cls);
    }
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      std::size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      if (status == cudaErrorMemoryAllocation)
        fail(op,
             out_of_memory_text(bytes, cls, current_, reserved_, released, free_bytes, total_bytes),
             "reduce the batch size or the model, or free device memory (other processes: "
             "nvidia-smi)");
      check_cuda(status, op, "cudaMalloc of " + std::to_string(cls) + " bytes");
    }
    reserved_ += cls;
  }
  live_.emplace(ptr, Block{bytes, cls});
  if (recording_) held_.insert(ptr);
  current_ += bytes;
  peak_ = std::max(peak_, current_);
  return ptr;
}

bool CachingAllocator::deallocate(void* ptr) noexcept {
  const auto it = live_.find(ptr);
  if (it == live_.end()) return false;
  current_ -= it->second.requested;
  bool held = false;
  try {
    held = held_.erase(ptr) != 0;
    if (held)
      retired_.emplace_back(ptr, it->second.size_class);  // a graph may still touch it
    else
      free_[it->second.size_class].push_back(ptr);
  } catch (...) {
    // Could not remember it. A block a live graph may still write is left allocated (a replay
    // would write into memory the driver hands out again); any other goes back to the driver.
    if (!held) {
      cudaFree(ptr);
      reserved_ -= it->second.size_class;
    }
  }
  live_.erase(it);
  return true;
}

std::size_t CachingAllocator::release_cached() noexcept {
  std::size_t released = 0;
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) {
      cudaFree(p);
      released += cls;
    }
    blocks.clear();
  }
  reserved_ -= released;
  return released;
}

void CachingAllocator::hold_for_recording() {
  for (const auto& [ptr, block] : live_) held_.insert(ptr);
  recording_ = true;
}

void CachingAllocator::release_held() noexcept {
  for (const auto& [ptr, cls] : retired_) {
    try {
      free_[cls].push_back(ptr);
    } catch (...) {
      cudaFree(ptr);
      reserved_ -= cls;
    }
  }
  retired_.clear();
  held_.clear();
  recording_ = false;
}

void CachingAllocator::account_external(std::ptrdiff_t delta) {
  current_ = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(current_) + delta);
  peak_ = std::max(peak_, current_);
}

}  // namespace mixtrain::backend_cuda
