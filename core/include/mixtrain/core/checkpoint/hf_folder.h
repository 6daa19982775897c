// A Hugging Face model folder of a gpt-preset model: the config.json and the weights that
// transformers' GPT2LMHeadModel.from_pretrained(folder) loads as its own save_pretrained wrote
// them. No model is built; it works on a resolved config and named host tensors.
//
// Contract
// - hf_gpt2_model() reads what the weights cannot say from a file's metadata: n_head of
//   [model.gpt] in the resolved config a mixtrain export or checkpoint carries
//   ("mixtrain.config", or "config" beside "mixtrain.state_version"); else, for a file written
//   elsewhere, an "n_head" entry. The config's model must be the gpt preset: any other model
//   (layers, a ResNet) is sdk::UserError naming what it is, as is metadata with neither. LayerNorm
//   eps, the GELU and dropout are the preset's own (config/model_presets.h), not options.
// - hf_gpt2_folder() takes the weights in the gpt2 layout (to_gpt2_layout()'s output) and
//   returns the tensors under GPT2LMHeadModel's names ("transformer." + the GPT2Model name),
//   with no lm_head.weight (the head is tied: save_pretrained leaves it out in safetensors and
//   from_pretrained ties it to transformer.wte.weight) and no attention-mask buffers (also not
//   saved). GPT-2 always has biases: each one the tensors lack (a bias = false model) is added as
//   zeros in its weight's dtype and named in `zero_biases`. config_json states architectures,
//   model_type, n_layer, n_head, n_embd, n_inner, n_positions (= n_ctx), vocab_size,
//   layer_norm_epsilon, activation_function, the dropout probabilities, tie_word_embeddings,
//   bos/eos_token_id (GPT-2's 50256 only when the vocabulary reaches it, else null) and
//   torch_dtype (`stored`: the dtype the weights are written in). sdk::UserError when n_embd is
//   not a multiple of n_head or `stored` has no torch dtype. The tensors are taken as a GPT-2's
//   (to_gpt2_layout() has checked them); sizes are read as gpt2_sizes() reads them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/sdk/dtype.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::core {

// The files of the folder, as from_pretrained looks for them.
inline constexpr std::string_view kHfConfigFile = "config.json";
inline constexpr std::string_view kHfWeightsFile = "model.safetensors";

struct HfGpt2Model {
  std::int64_t n_head = 0;
  double layer_norm_epsilon = 0;
  std::string activation_function;  // transformers' name of the preset's GELU
  double dropout = 0;               // attn_pdrop = embd_pdrop = resid_pdrop
};

// `origin` names the file in messages.
HfGpt2Model hf_gpt2_model(const std::map<std::string, std::string>& metadata,
                          const std::string& origin);

struct HfGpt2Folder {
  std::vector<sdk::HostTensor> tensors;  // model.safetensors, save_pretrained's names
  std::string config_json;               // config.json
  std::vector<std::string> zero_biases;  // the biases added as zeros (bias = false)
};

HfGpt2Folder hf_gpt2_folder(std::vector<sdk::HostTensor> gpt2_tensors, const HfGpt2Model& model,
                            sdk::DType stored, const std::string& origin);

}  // namespace mixtrain::core
