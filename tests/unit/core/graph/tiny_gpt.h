// The gpt preset's graph at test sizes, for the core's unit tests: n_layer blocks of width n_embd
// in n_head heads over a vocabulary of `vocab`, its LM head tied to wte (config/model_presets.h).
#pragma once

#include <cstdint>

#include "config/model_presets.h"
#include "mixtrain/core/graph/model_spec.h"

namespace mixtrain::core::test_support {

inline ModelSpec tiny_gpt_spec(std::int64_t n_layer = 2, std::int64_t n_head = 2,
                               std::int64_t n_embd = 8, std::int64_t vocab = 11) {
  GptPreset p;
  p.n_layer = n_layer;
  p.n_head = n_head;
  p.n_embd = n_embd;
  p.vocab_size = vocab;
  ModelSpec spec;
  spec.layers = gpt_preset(p);
  spec.graph = true;
  return spec;
}

}  // namespace mixtrain::core::test_support
