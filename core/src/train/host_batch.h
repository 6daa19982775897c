// HostBatch: one batch's host side on its way to the device (features, byte images' pixels, token
// ids, labels), each array in the backend's upload memory where it offers some
// (sdk/backend_host_memory.h: page-locked on CUDA, so the upload reads the batch in place with no
// staging copy on the step's thread) and in an ordinary vector otherwise. Internal to the core.
//
// Contract
// - HostMemory: where the arrays' memory comes from. Over the backend's host_memory facet (nullptr:
//   none, or data.pin_memory off), allocate(bytes) returns a buffer, or nullptr when there is no
//   facet or it refused; the first refusal is logged (warn) and nothing is asked after it, so the
//   arrays use ordinary memory. Safe from any thread (the loader thread may grow an array). It
//   outlives every array made from it.
// - HostArray<T>: data() and size() as a vector's; resize(n) keeps no contents when it grows (every
//   writer fills what it uses) and never shrinks the memory.
// - HostBatch::prepare_to_write(): waits until the backend's uploads from its arrays (the previous
//   batch sent from them) have read them. Whoever writes a batch calls it first: the upload from a
//   buffer may still be reading it when copy_from_host or decode_images returns.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "mixtrain/sdk/backend_host_memory.h"
#include "mixtrain/sdk/logging.h"

namespace mixtrain::core {

class HostMemory {
 public:
  HostMemory(sdk::HostMemoryFacet* facet, sdk::Logger log) : facet_(facet), log_(std::move(log)) {}
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  std::unique_ptr<sdk::HostBuffer> allocate(std::size_t bytes) const;
  // Whether arrays get the backend's memory (a facet, and no refusal so far).
  bool pinned() const { return facet_ != nullptr && !refused_.load(); }

 private:
  sdk::HostMemoryFacet* facet_;
  sdk::Logger log_;
  mutable std::atomic<bool> refused_{false};
};

template <class T>
class HostArray {
 public:
  explicit HostArray(const HostMemory* memory = nullptr) : memory_(memory) {}

  T* data() { return pinned_ ? reinterpret_cast<T*>(pinned_->data()) : plain_.data(); }
  const T* data() const {
    return pinned_ ? reinterpret_cast<const T*>(pinned_->data()) : plain_.data();
  }
  std::size_t size() const { return size_; }

  void resize(std::size_t n) {
    if (n > capacity()) {
      // The old buffer's destructor waits for its uploads before it frees the memory.
      std::unique_ptr<sdk::HostBuffer> grown =
          memory_ != nullptr ? memory_->allocate(n * sizeof(T)) : nullptr;
      if (grown) {
        pinned_ = std::move(grown);
        plain_ = {};
      } else {
        std::vector<T> plain(n);  // first: a bad_alloc leaves the array as it was
        plain_.swap(plain);
        pinned_.reset();
      }
    }
    size_ = n;
  }

  void wait_until_read() {
    if (pinned_) pinned_->wait_until_read();
  }

 private:
  std::size_t capacity() const { return pinned_ ? pinned_->size() / sizeof(T) : plain_.size(); }

  const HostMemory* memory_;
  std::unique_ptr<sdk::HostBuffer> pinned_;
  std::vector<T> plain_;
  std::size_t size_ = 0;
};

struct HostBatch {
  explicit HostBatch(const HostMemory* memory = nullptr)
      : x(memory), pixels(memory), ids(memory), y(memory) {}

  void prepare_to_write() {
    x.wait_until_read();
    pixels.wait_until_read();
    ids.wait_until_read();
    y.wait_until_read();
  }

  HostArray<float> x;              // features [rows, F] in FP32
  HostArray<std::uint8_t> pixels;  // byte images [rows, F], decoded on the device
  HostArray<std::int32_t> ids;     // token windows' ids [rows, T]
  HostArray<std::int32_t> y;       // labels [rows · labels_per_row]
};

}  // namespace mixtrain::core
