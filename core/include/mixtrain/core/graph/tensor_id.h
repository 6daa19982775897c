// TensorId: which tensor of a model graph a value is — the batch the data feeds, or a node's
// output — as a type, so that "the batch" is never an index of -1 that slips into a vector.
//
// Contract
// - TensorId::batch() is the graph's input; TensorId::node(i) is the output of the node at
//   forward position i (GraphPlan::node(i)). node() on the batch is a logic error (asserted).
// - Cheap to copy, totally ordered (the batch first), usable as a key.
#pragma once

#include <cassert>
#include <compare>
#include <cstddef>
#include <cstdint>

namespace mixtrain::core {

class TensorId {
 public:
  static constexpr TensorId batch() { return TensorId(-1); }
  static constexpr TensorId node(std::size_t position) {
    return TensorId(static_cast<std::int64_t>(position));
  }
  constexpr bool is_batch() const { return value_ < 0; }
  constexpr bool is_node() const { return value_ >= 0; }
  // The node's forward position; only for a node.
  constexpr std::size_t position() const {
    assert(is_node());
    return static_cast<std::size_t>(value_);
  }
  constexpr auto operator<=>(const TensorId&) const = default;

 private:
  constexpr explicit TensorId(std::int64_t v) : value_(v) {}
  std::int64_t value_;
};

// How many rows each tensor of one pass has. A batch of `samples` samples (training, evaluation):
// the batch is [samples, features] and a node's output [samples · rows_per_sample, last dim].
// A decode step of `tokens` new positions of one sequence (generation over a KV cache): the batch
// is the [1, tokens] ids, and every node's output [tokens, last dim].
struct Extent {
  static constexpr Extent batch_of(std::int64_t samples) { return {samples, 0}; }
  static constexpr Extent decode_of(std::int64_t tokens) { return {1, tokens}; }
  constexpr bool decoding() const { return tokens > 0; }
  std::int64_t samples = 0;
  std::int64_t tokens = 0;  // > 0: a decode step
};

}  // namespace mixtrain::core
