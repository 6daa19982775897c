// Decoder: one sequence of a language model decoded token by token over a KV cache
// (`mixtrain sample`), as a client of the model's executor — a pass over only the new tokens.
//
// Contract
// - The model must read token ids and be per position: every node [T, C] per sample
//   (rows_per_sample = T, no op mixing positions but attention); otherwise the constructor throws
//   sdk::UserError naming the node. capacity is in [1, T].
// - The sequence's state is the Decoder's own: each op's decode state (Layer::make_decode_state:
//   attention's KV cache, the position ids), made at construction, freed with the Decoder. No op
//   is switched into a decoding mode, so the model trains as usual while a Decoder exists (a
//   step that changes the weights changes what later decode steps compute, not the cache), and
//   several Decoders may decode one model in turn.
// - Each decode step runs in evaluation mode (no dropout) and gives the model back the mode it
//   found (Model::set_mode).
// - decode(ids) feeds the next ids (at most max_rows · T at once, positions continuing from the
//   last call) and returns the logits of the last one, fp32 [classes] on the host. It throws
//   sdk::UserError when the cache would overflow or an id is outside the vocabulary.
// - reset() empties the cache: the next decode starts at position 0.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "mixtrain/core/graph/model.h"

namespace mixtrain::core {

class Decoder {
 public:
  Decoder(Model& model, std::int64_t capacity);
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  std::vector<float> decode(std::span<const std::int32_t> ids);
  void reset();
  std::int64_t length() const { return length_; }
  std::int64_t capacity() const { return capacity_; }

 private:
  Model& model_;
  std::int64_t capacity_ = 0, length_ = 0;
  std::vector<std::unique_ptr<DecodeState>> states_;  // per node, in forward order
};

}  // namespace mixtrain::core
