// Model presets: a whole architecture from a few sizes, expanded into the model's op nodes.
//
// Contract
// - gpt_preset(): a GPT-2-style decoder ([model] preset = "gpt", sizes in [model.gpt]) as graph
//   nodes named exactly as Hugging Face GPT-2's modules, so parameter names need no mapping:
//   wte, wpe, h.<i>.ln_1, h.<i>.attn.c_attn, h.<i>.attn, h.<i>.attn.c_proj, h.<i>.ln_2,
//   h.<i>.mlp.c_fc, h.<i>.mlp.gelu, h.<i>.mlp.c_proj, ln_f, and lm_head (no bias, tied to
//   wte.weight). Pre-LN blocks with residual adds (h.<i>.residual_1/2); GELU (tanh); init as
//   GPT-2: N(0, 0.02²), the residual projections N(0, (0.02/√(2·n_layer))²), biases 0.
// - Every node carries `where` (the [model.gpt] table) and `table` ("model.gpt"), so plan-time
//   errors point there.
#pragma once

#include <cstdint>
#include <vector>

#include "mixtrain/core/model.h"

namespace mixtrain::core {

struct GptPreset {
  std::int64_t n_layer = 0, n_head = 0, n_embd = 0;
  std::int64_t vocab_size = 0;
  std::int64_t block_size = 0;  // positions of wpe; 0: the data's block_size
  bool bias = true;
  sdk::SourceLocation where;
};

std::vector<LayerSpec> gpt_preset(const GptPreset& preset);

}  // namespace mixtrain::core
