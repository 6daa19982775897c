// PrimitiveCache: the oneDNN engine, stream, cached primitives and grow-only scratch of the
// convolution facet (conv2d, pooling); the layout permutes borrow its scratch.
//
// Contract
// - A primitive (with its descriptors and the reorders around it) is created once per key and
//   reused for every later call with that key; a key is an op tag followed by every integer that
//   decides the primitive (geometry, oneDNN data types, flags). Creating oneDNN primitives costs
//   milliseconds, so no op creates one per call; dnnl::memory objects wrapping the caller's
//   pointers are made per call (cheap).
// - size() counts the entries created so far (for tests: a second call with the same key adds
//   nothing). report() lists them, sorted: the problem each was made for, as the caller named it
//   at creation, and oneDNN's implementation (the plan_report facet's "oneDNN convolution").
// - Scratch buffers are grow-only, one per Slot, reused across calls; scratch_bytes() is what they
//   hold (counted in the backend's memory statistics).
// - Lending (convolution facet 1.2: a convolution's workspace from its caller): while a Lease is
//   alive, scratch() takes a slot's memory from the caller's workspace instead of the slot's own
//   buffer: the slot's first request at the next 64-byte boundary after the previous one's end, a
//   later request of that slot no larger than its first the same memory (as the slot's own buffer
//   is), any other request the slot's own buffer. lent_bytes(requests) is what first requests of
//   those sizes take of a workspace (each from a 64-byte boundary, and 63 bytes for the
//   workspace's own start), so a workspace of that size holds them all, however it is aligned.
// - Not thread-safe: one cache per backend, used by one host thread at a time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "cpu_scratch_buffer.h"
#include "mixtrain/sdk/dtype.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::backend_cpu {

class PrimitiveCache {
 public:
  using Key = std::vector<std::int64_t>;
  // Scratch slots: decoded source, decoded weights (plain), weights in the primitive's layout,
  // fp32 destination, gradients in the primitive's layout, two spares, and two activations in a
  // primitive's blocked layout (Winograd convolutions take no nhwc: an input reordered in, the
  // output reordered out).
  enum class Slot {
    src,
    weights,
    weights_blocked,
    dst,
    diff_blocked,
    extra_a,
    extra_b,
    blocked_a,
    blocked_b,
    count
  };

  PrimitiveCache();

  dnnl::engine& engine() { return engine_; }
  dnnl::stream& stream() { return stream_; }

  // The entry for `key`, made by `make()` (which returns an Entry with a string `implementation`)
  // on the first call, which also asks `problem()` for the text report() names it by.
  template <class Entry, class Make, class Problem>
  Entry& get(const Key& key, Make&& make, Problem&& problem) {
    if (auto it = entries_.find(key); it != entries_.end())
      return *static_cast<Entry*>(it->second.entry.get());
    auto entry = std::make_shared<Entry>(std::forward<Make>(make)());
    Entry& ref = *entry;
    std::string line = std::forward<Problem>(problem)() + ": " + ref.implementation;
    // A Winograd entry oneDNN cannot serve keeps the reason in `implementation`; the op runs
    // direct.
    if constexpr (requires { ref.usable; })
      if (!ref.usable) line += " (not usable here: the direct convolution runs)";
    entries_.emplace(key, Cached{std::move(entry), std::move(line)});
    return ref;
  }
  std::size_t size() const { return entries_.size(); }
  std::vector<std::string> report() const;

  template <class T>
  T* scratch(Slot slot, std::size_t count) {
    if (lent_end_ != nullptr)
      if (void* p = lent(slot, count * sizeof(T)); p != nullptr) return static_cast<T*>(p);
    return scratch_[static_cast<std::size_t>(slot)].as<T>(count);
  }
  std::size_t scratch_bytes() const;

  class Lease {
   public:
    Lease(PrimitiveCache& cache, void* data, std::size_t bytes);
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

   private:
    PrimitiveCache& cache_;
  };
  static std::size_t lent_bytes(std::span<const std::size_t> requests);

  // Runs `p` with `args` on the stream and waits.
  void execute(const dnnl::primitive& p, const std::unordered_map<int, dnnl::memory>& args);
  // A memory object over the caller's (or scratch) pointer.
  dnnl::memory wrap(const dnnl::memory::desc& md, const void* data) {
    return dnnl::memory(md, engine_, const_cast<void*>(data));
  }

 private:
  struct KeyHash {
    std::size_t operator()(const Key& key) const noexcept;
  };
  dnnl::engine engine_;
  dnnl::stream stream_;
  struct Cached {
    std::shared_ptr<void> entry;
    std::string line;  // report()'s
  };
  std::unordered_map<Key, Cached, KeyHash> entries_;
  std::array<ScratchBuffer, static_cast<std::size_t>(Slot::count)> scratch_;
  // The lent workspace (a Lease's), handed out up to lent_next_ of its end lent_end_; each
  // slot's memory there (null: none yet) and its bytes.
  void* lent(Slot slot, std::size_t bytes);
  std::byte *lent_next_ = nullptr, *lent_end_ = nullptr;
  struct LentSlot {
    std::byte* at = nullptr;
    std::size_t bytes = 0;
  };
  std::array<LentSlot, static_cast<std::size_t>(Slot::count)> lent_slots_{};
};

// Whether oneDNN's implementation name is one of its reference (slow, scalar) kernels.
inline bool is_reference_kernel(std::string_view implementation) {
  return implementation.find("ref") != std::string_view::npos;
}

// The oneDNN data type of fp32 storage (fp32, tf32) and bf16.
inline dnnl::memory::data_type dnnl_type_of(sdk::DType t) {
  return t == sdk::DType::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

// What a primitive of data type `dt` (f32 or bf16) reads for `v`: v itself when it is stored in
// that type, else its values decoded exactly to fp32 into the cache's scratch `slot`.
const void* as_input(PrimitiveCache& cache, const sdk::TensorView& v, dnnl::memory::data_type dt,
                     PrimitiveCache::Slot slot);
// Where such a primitive writes `v`: v itself, or fp32 scratch the caller then encodes into v
// (encode_tensor).
void* as_output(PrimitiveCache& cache, const sdk::TensorView& v, dnnl::memory::data_type dt,
                PrimitiveCache::Slot slot);

}  // namespace mixtrain::backend_cpu
