// Text generation from a language model with a KV cache (`mixtrain sample`).
//
// Contract
// - generate() feeds the prompt once (prefill), then one token per step, each decode step
//   running the model on the new token only (Decoder::decode; the Decoder's KV cache keeps k and
//   v of every earlier position). When the context reaches the model's block_size the cache
//   restarts from the last block_size / 2 tokens: a window that slides by half a block. nanoGPT
//   instead crops to the last block_size tokens at every step, a full forward per token; past
//   block_size tokens the two condition on different contexts, so their outputs part.
// - sample_token(): temperature 0 is greedy (argmax, the lowest id on ties); otherwise softmax of
//   logits / temperature in double, restricted to the top_k largest logits when top_k > 0 (ties
//   at the k-th value are kept), drawn with DataRng — the same ids for the same seed on every
//   machine given the same logits.
// - Errors: an empty prompt, a temperature < 0 or a prompt id outside the vocabulary are
//   sdk::UserError.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "mixtrain/core/data/dataset.h"
#include "mixtrain/core/graph/model.h"

namespace mixtrain::core {

struct SamplingOptions {
  std::int64_t tokens = 0;  // how many to generate
  double temperature = 1.0;
  std::int64_t top_k = 0;  // 0: the whole vocabulary
  std::uint64_t seed = 0;
};

std::int32_t sample_token(std::span<const float> logits, double temperature, std::int64_t top_k,
                          DataRng& rng);

// The generated ids (prompt excluded); `on_token` sees each as it is chosen.
std::vector<std::int32_t> generate(Model& model, std::span<const std::int32_t> prompt,
                                   const SamplingOptions& options,
                                   const std::function<void(std::int32_t)>& on_token = {});

}  // namespace mixtrain::core
