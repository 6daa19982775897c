// CachingAllocator: device memory for one CUDA backend, cached in size classes.
//
// Contract
// - allocate() rounds the request up to a size class (powers of two from 512 B up to 1 MiB, then
//   multiples of 2 MiB), reuses a cached block of that class when one is free, else cudaMalloc's
//   one; when cudaMalloc runs out of memory it synchronises the device, releases every cached
//   block and tries once more, then throws sdk::BackendError naming the bytes asked, the bytes
//   allocated, reserved and released from the cache, and what cudaMemGetInfo reports free/total
//   (out_of_memory_text). The core adds which buffer it was and the model's memory plan.
// - Blocks come back to the cache on deallocate(); because every op of the backend runs on one
//   stream, a block reused by a later op is only touched after the earlier ops that used it.
// - Step graphs hold raw addresses of whatever they recorded, so a block a graph may touch must not
//   be reused or freed while the graph lives. hold_for_recording() (a recording starts) holds every
//   live block, and every block allocated until end_recording(); a held block that is deallocated
//   is retired: neither cached for reuse nor freed by release_cached(). release_held() (the last
//   graph gone and the stream idle, or a recording that made no graph while none lives) returns
//   the retired blocks to the cache and holds nothing.
// - Statistics count the bytes callers asked for (live and peak), like the CPU backend; reserved()
//   is what the cache holds from the driver. Not thread-safe: the backend serialises calls.
#pragma once

#include <cstddef>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace mixtrain::backend_cuda {

class CachingAllocator {
 public:
  CachingAllocator() = default;
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(std::size_t bytes, const char* op = "allocate");
  // Returns false when ptr is not a live block of this allocator (nothing is freed then).
  bool deallocate(void* ptr) noexcept;
  // Frees every cached (not live) block; returns the bytes released.
  std::size_t release_cached() noexcept;

  std::size_t current() const { return current_; }
  std::size_t peak() const { return peak_; }
  std::size_t live_count() const { return live_.size(); }
  std::size_t reserved() const { return reserved_; }
  void reset_peak() { peak_ = current_; }
  void hold_for_recording();
  void end_recording() noexcept { recording_ = false; }
  void release_held() noexcept;
  std::size_t retired_count() const { return retired_.size(); }
  // Adds (or removes) bytes the backend holds outside the cache (workspaces) to the statistics.
  void account_external(std::ptrdiff_t delta);

  static std::size_t size_class(std::size_t bytes);
  // The out-of-memory error's text: the bytes asked and their size class, the bytes callers hold
  // (allocated), what the cache holds from the driver (reserved) and released for the retry, and
  // cudaMemGetInfo's free and total. Pure: host-tested.
  static std::string out_of_memory_text(std::size_t bytes, std::size_t size_class,
                                        std::size_t allocated, std::size_t reserved,
                                        std::size_t released, std::size_t free_bytes,
                                        std::size_t total_bytes);

 private:
  struct Block {
    std::size_t requested;
    std::size_t size_class;
  };
  std::unordered_map<void*, Block> live_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::unordered_set<void*> held_;
  std::vector<std::pair<void*, std::size_t>> retired_;  // block, size class
  bool recording_ = false;
  std::size_t current_ = 0;
  std::size_t peak_ = 0;
  std::size_t reserved_ = 0;
};

}  // namespace mixtrain::backend_cuda
