// Weight layouts of a GPT: mixtrain's own ("native") and Hugging Face GPT-2's ("gpt2"), and the
// conversion between them. It works on named host tensors only; no model is built.
//
// Contract
// - Names: the gpt preset (config/model_presets.h) already names its parameters as GPT2Model does:
//   wte.weight [V, C], wpe.weight [T, C], h.<i>.{ln_1,ln_2}.{weight,bias} [C],
//   h.<i>.attn.c_attn.* (3C outputs), h.<i>.attn.c_proj.* (C), h.<i>.mlp.c_fc.* (4C),
//   h.<i>.mlp.c_proj.* (C), ln_f.{weight,bias} [C]. The tied lm_head stores nothing.
// - The only difference between the layouts is the weight of those four linears, which GPT-2
//   stores as a Conv1D, [in, out], and mixtrain as torch.nn.Linear, [out, in]. Those (2-D) weights
//   are transposed; every other tensor passes through with its bytes, dtype and order unchanged,
//   so native -> gpt2 -> native is bit-identical. Any element size is transposed (fp32, bf16, ...).
// - to_gpt2_layout() takes a gpt-preset model's weights (plain names, no "param/"). It throws
//   sdk::CheckpointError, prefixed with `origin`, when they are not such a model: naming the
//   first missing tensor (wte.weight, wpe.weight, ln_f.weight, h.0.*, a layer's part) or a tensor
//   GPT-2 has no place for, or a linear weight that is not [out, in] for wte's width (a GPT-2
//   state dict's [in, out] Conv1D weights, which a second transposition would scramble). Biases
//   are optional (the preset's `bias = false`).
// - from_gpt2_layout() takes a file's tensors as GPT2Model or GPT2LMHeadModel saved them: a
//   "transformer." prefix is stripped, the causal-mask buffers h.<i>.attn.bias and
//   h.<i>.attn.masked_bias are dropped, and lm_head.weight is dropped when it equals wte.weight
//   (shape and bytes: a tied head). sdk::CheckpointError, prefixed with `origin` and naming the
//   tensor: an lm_head.weight that differs (an untied head, which the tied model cannot hold),
//   a name that is not a GPT-2 weight, two tensors for one name, a Conv1D weight that is not 2-D.
//   Whether every parameter is present, and the shapes, the loader checks against the model.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::core {

enum class WeightLayout { native, gpt2 };

// "native" / "gpt2", the spelling of checkpoint.init_layout and of the --layout options.
std::string_view weight_layout_name(WeightLayout layout);
// The inverse of weight_layout_name(); std::invalid_argument for any other text (the callers'
// schemas and option checks admit only the two names).
WeightLayout parse_weight_layout(std::string_view name);

// Whether `name` (a mixtrain parameter name) is one of the weights the layouts store transposed:
// h.<i>.attn.c_attn.weight, h.<i>.attn.c_proj.weight, h.<i>.mlp.c_fc.weight,
// h.<i>.mlp.c_proj.weight.
bool is_conv1d_weight(std::string_view name);

std::vector<sdk::HostTensor> to_gpt2_layout(std::vector<sdk::HostTensor> tensors,
                                            const std::string& origin);

struct Gpt2Import {
  std::vector<sdk::HostTensor> tensors;  // mixtrain's names, [out, in] linear weights
  std::vector<std::string> file_names;   // file_names[i]: tensors[i]'s name in the file
  std::vector<std::string> dropped;      // mask buffers and a tied lm_head.weight, file names
};

Gpt2Import from_gpt2_layout(std::vector<sdk::HostTensor> tensors, const std::string& origin);

// The sizes a GPT-2 config states, read off wte.weight [V, C], wpe.weight [T, C] and the h.<i>
// layers (either layout). Zero where the tensor is absent or not 2-D.
struct Gpt2Sizes {
  std::int64_t n_layer = 0, n_embd = 0, vocab_size = 0, n_positions = 0;
};
Gpt2Sizes gpt2_sizes(const std::vector<sdk::HostTensor>& tensors);

}  // namespace mixtrain::core
