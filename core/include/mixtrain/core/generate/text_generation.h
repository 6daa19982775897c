// Text generation from a language model with a KV cache (`mixtrain sample`).
//
// Contract
// - generate() feeds the prompt once (prefill), then one token per step, each decode step
//   running the model on the new token only (Decoder::decode; the Decoder's KV cache keeps k and
//   v of every earlier position). When the context reaches the model's block_size the cache
//   restarts from the last block_size / 2 tokens: a window that slides by half a block. nanoGPT
//   instead crops to the last block_size tokens at every step, a full forward per token; past
//   block_size tokens the two condition on different contexts, so their outputs part.
//   Generation ends after `tokens` ids, or right after an id of `stop_ids` (which is returned).
// - The logits of a step pass through Hugging Face's processors in its order:
//   1. repetition_penalty (its RepetitionPenaltyLogitsProcessor): each id that occurs in the
//      context (prompt and generated ids) has its logit divided by the penalty when positive,
//      multiplied by it when negative; 1 leaves them;
//   2. temperature 0 is greedy: the argmax (the lowest id on ties), no draw;
//   3. otherwise logits / temperature; top_k > 0 keeps the top_k largest (ties at the k-th value
//      stay in); top_p < 1 keeps, in decreasing order, each id whose predecessors' probability
//      (after top_k) is below top_p, so always at least one (ties at the boundary stay in).
//   sampling_distribution() returns those probabilities, in double; sample_token() draws from them
//   with DataRng: the same ids for the same seed on every machine given the same logits (up to
//   the C library's exp in the last bit, which moves a draw only when it lands on a boundary).
// - Errors: an empty prompt, a temperature < 0, a top_p outside (0, 1], a repetition_penalty
//   that is not > 0 (each non-finite included), a negative `vocabulary` or one past the model's
//   outputs, or a prompt id outside the vocabulary are sdk::UserError; so are non-finite logits
//   at a step (NaN or infinite weights, an overflowing forward), which nothing can be drawn from.
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
  double top_p = 1.0;      // 1: the whole vocabulary
  double repetition_penalty = 1.0;
  std::vector<std::int32_t> stop_ids;  // generation ends after emitting one
  std::uint64_t seed = 0;
  // 0: every id the model outputs can be drawn. Otherwise only ids below it: a model whose output
  // layer is padded past its data's vocabulary (a byte-level model with vocab_size > 256) never
  // emits an id no token of its data has.
  std::int64_t vocabulary = 0;
};

// Throws sdk::UserError naming the first option out of range (see the contract).
void check_sampling_options(const SamplingOptions& options);

// Step 1 in place: `context` is every id so far (prompt and generated).
void apply_repetition_penalty(std::span<float> logits, std::span<const std::int32_t> context,
                              double penalty);

// Step 3's probabilities, one per id (0 outside the candidates); needs temperature > 0.
std::vector<double> sampling_distribution(std::span<const float> logits,
                                          const SamplingOptions& options);

// Steps 2 and 3: the chosen id.
std::int32_t sample_token(std::span<const float> logits, const SamplingOptions& options,
                          DataRng& rng);

// The generated ids (prompt excluded); `on_token` sees each as it is chosen.
std::vector<std::int32_t> generate(Model& model, std::span<const std::int32_t> prompt,
                                   const SamplingOptions& options,
                                   const std::function<void(std::int32_t)>& on_token = {});

}  // namespace mixtrain::core
