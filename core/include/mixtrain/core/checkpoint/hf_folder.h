// A Hugging Face model folder of a gpt-preset model: the config.json and the weights that
// transformers' GPT2LMHeadModel.from_pretrained(folder) loads as its own save_pretrained wrote
// them, and the way back: such a folder read as the gpt preset's sizes ([model] from_pretrained).
// No model is built; it works on a resolved config, named host tensors and config.json.
//
// Contract
// - hf_gpt2_model() reads what the weights cannot say from a file's metadata: n_head of
//   [model.gpt] in the resolved config a mixtrain export or checkpoint carries
//   ("mixtrain.config", or "config" beside "mixtrain.state_version"); else, for a file written
//   elsewhere, an "n_head" entry. The config's model must be the gpt preset: any other model
//   (layers, a ResNet) is sdk::UserError naming what it is, as is metadata with neither. The
//   config's bos_token_id and eos_token_id, when it states them (-1: none, -2: GPT-2's rule
//   below), go to config.json.
// - hf_gpt2_folder() takes the weights in the gpt2 layout (to_gpt2_layout()'s output) and
//   returns the tensors under GPT2LMHeadModel's names ("transformer." + the GPT2Model name),
//   with no lm_head.weight (the head is tied: save_pretrained leaves it out in safetensors and
//   from_pretrained ties it to transformer.wte.weight) and no attention-mask buffers (also not
//   saved). GPT-2 always has biases: each one the tensors lack (a bias = false model) is added as
//   zeros in its weight's dtype and named in `zero_biases`. config_json states architectures,
//   model_type, the sizes (n_layer, n_head, n_embd, vocab_size, n_positions = n_ctx), what the
//   preset fixes (n_inner = 4·n_embd, activation_function "gelu_new", layer_norm_epsilon 1e-5,
//   scale_attn_weights, no scale_attn_by_inverse_layer_idx, tie_word_embeddings, no
//   add_cross_attention), the dropout probabilities (0), bos/eos_token_id (the model's, null for
//   -1; for -2 or a config that states none: GPT-2's 50256 only when the vocabulary reaches it,
//   else null)
//   and torch_dtype (`stored`: the dtype the weights
//   are written in). sdk::UserError when n_embd is not a multiple of n_head or `stored` has no
//   torch dtype. The tensors are taken as a GPT-2's (to_gpt2_layout() has checked them); sizes
//   are read as gpt2_sizes() reads them.
// - parse_hf_gpt2_config() is the inverse of config_json: the [model.gpt] sizes a config.json
//   states, each with the field it came from. The same list of fields serves both directions.
//   Refused, as sdk::ConfigError at `origin` naming the field and its value: text that is not a
//   JSON object; a model_type other than "gpt2" (or none); a size that is absent, not an
//   integer, below 1 or above [model.gpt]'s range; n_embd not a multiple of n_head; n_ctx other
//   than n_positions; and any field whose value the preset cannot compute (n_inner other than
//   null or 4·n_embd, and each fixed field above, GPT2Config's default standing in for an
//   absent one). Dropout is training noise, not the function: a non-zero attn_pdrop, embd_pdrop
//   or resid_pdrop (GPT2Config's 0.1 when absent) is accepted and named in `notes`, since the
//   preset trains without it. bos_token_id and eos_token_id become `token_ids` (an integer in
//   [0, vocab_size), null or absent as GPT2Config reads them: 50256, -1 for null, an id past the
//   vocabulary, or anything else, such as a list; the last two are named in `notes`). Other fields
//   that do not change the logits' function are not read: architectures, initializer_range,
//   use_cache, reorder_and_upcast_attn (the same attention, computed in another order and width),
//   ...
// - open_hf_gpt2_folder() checks a folder holds what from_pretrained reads: config.json (parsed
//   as above, its refusals as above) and model.safetensors. sdk::UserError naming the path: no
//   such folder, no config.json, weights only in pytorch_model.bin (a pickle, never unpickled
//   here: the hint says how to re-save as safetensors), only sharded safetensors, or no weights
//   at all. The weights themselves are read, and checked tensor by tensor, by the loader
//   (checkpoint.init_from in the gpt2 layout).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/sdk/dtype.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::core {

// The files of the folder, as from_pretrained looks for them; the last two it refuses.
inline constexpr std::string_view kHfConfigFile = "config.json";
inline constexpr std::string_view kHfWeightsFile = "model.safetensors";
inline constexpr std::string_view kHfPickleWeightsFile = "pytorch_model.bin";
inline constexpr std::string_view kHfShardIndexFile = "model.safetensors.index.json";

// The tokenizer's files a Hugging Face folder may hold beside the model (AutoTokenizer reads
// them): an exported folder of a run that started from one carries them over.
inline constexpr std::string_view kHfTokenizerFiles[] = {
    "tokenizer.json", "tokenizer_config.json",   "vocab.json",
    "merges.txt",     "special_tokens_map.json", "added_tokens.json"};

// What the weights do not say: the head count. Everything else config.json states is either a
// size the weights have or fixed by the preset.
struct HfGpt2Model {
  std::int64_t n_head = 0;
  // The token ids generate() starts and stops with: -1 none, -2 GPT-2's rule (config_json);
  // nullopt when the config states none (a run before the keys existed).
  std::optional<std::int64_t> bos_token_id, eos_token_id;
};

// A [model.gpt] bos_token_id or eos_token_id as generation uses it: the id, or none for -1; for
// -2 (and a config from before the keys, nullopt) GPT-2's <|endoftext|>, 50256, only when
// `vocab_size` reaches it (a byte-level or smaller model has no such token).
std::optional<std::int64_t> gpt2_token_id(std::optional<std::int64_t> stated,
                                          std::int64_t vocab_size);

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

// One [model.gpt] size as config.json states it.
struct HfGpt2Size {
  std::string key;    // [model.gpt]'s name: "block_size"
  std::string field;  // config.json's: "n_positions"
  std::int64_t value = 0;
};

struct HfGpt2Config {
  // n_layer, n_head, n_embd, vocab_size, block_size: every size of [model.gpt], in that order.
  std::vector<HfGpt2Size> sizes;
  // bos_token_id, eos_token_id, under [model.gpt]'s names (the same as config.json's).
  std::vector<HfGpt2Size> token_ids;
  // Fields read and accepted that the preset does not model, each a sentence naming it.
  std::vector<std::string> notes;
};

HfGpt2Config parse_hf_gpt2_config(std::string_view text, const std::string& origin);

struct HfGpt2Pretrained {
  HfGpt2Config config;
  std::filesystem::path config_file;   // <folder>/config.json
  std::filesystem::path weights_file;  // <folder>/model.safetensors
};

HfGpt2Pretrained open_hf_gpt2_folder(const std::filesystem::path& folder);

}  // namespace mixtrain::core
