// AddressRanges<Block>: host memory blocks by address, so an upload can tell whether its source
// lies inside one of the host_memory facet's page-locked buffers (sdk/backend_host_memory.h) and
// read it in place. Plain C++, host-tested (test_cuda_address_ranges).
//
// Contract
// - add(begin, bytes, block): the block owns [begin, begin + bytes); ranges never overlap (they are
//   live allocations). remove(begin) forgets it; an unknown begin is ignored.
// - find(src, bytes): the block whose range holds all of [src, src + bytes), else nullptr (also for
//   a range that starts inside a block and runs past its end, or bytes = 0).
// - Every method takes the one mutex: add and remove may run on a loader thread while the backend's
//   thread calls find. The block a find returns stays valid while its owner keeps it alive (the
//   host_memory contract: a buffer is not freed while an upload from it is being queued).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace mixtrain::backend_cuda {

template <class Block>
class AddressRanges {
 public:
  void add(const void* begin, std::size_t bytes, Block* block) {
    std::lock_guard lock(mutex_);
    ranges_[address(begin)] = Range{bytes, block};
  }
  void remove(const void* begin) {
    std::lock_guard lock(mutex_);
    ranges_.erase(address(begin));
  }
  Block* find(const void* src, std::size_t bytes) const {
    if (bytes == 0) return nullptr;
    const std::uintptr_t at = address(src);
    std::lock_guard lock(mutex_);
    auto it = ranges_.upper_bound(at);  // the first block starting after src
    if (it == ranges_.begin()) return nullptr;
    --it;  // the last block starting at or before src
    const std::uintptr_t offset = at - it->first;
    return offset < it->second.bytes && bytes <= it->second.bytes - offset ? it->second.block
                                                                           : nullptr;
  }
  std::size_t size() const {
    std::lock_guard lock(mutex_);
    return ranges_.size();
  }

 private:
  struct Range {
    std::size_t bytes = 0;
    Block* block = nullptr;
  };
  static std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

  mutable std::mutex mutex_;
  std::map<std::uintptr_t, Range> ranges_;
};

}  // namespace mixtrain::backend_cuda
