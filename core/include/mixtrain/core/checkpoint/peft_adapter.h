// PEFT's LoRA adapter folder, as PeftModel.save_pretrained writes it (adapter_config.json beside
// adapter_model.safetensors): what `[model.lora] from_peft` starts a run's adapters from, and
// what `mixtrain export --layout peft` writes (cli/lora_export.h). No model is built here: it
// reads the config file and names the tensors; the trainer loads them (train/peft_import.h).
//
// Contract
// - open_peft_adapter() checks the folder holds what PeftModel.from_pretrained reads and parses
//   its config. sdk::UserError naming the path: no such folder, no adapter_config.json, weights
//   only in adapter_model.bin (a Python pickle, never unpickled here: the hint says how to save
//   safetensors), no weights at all; the config's refusals below.
// - parse_peft_adapter_config() reads PEFT's LoraConfig. Read: peft_type (must be "LORA"), r (an
//   integer >= 1), lora_alpha (a number > 0), lora_dropout (a number in [0, 1); absent or null:
//   0), target_modules (a list of names, or one string: a regular expression),
//   base_model_name_or_path (kept, for messages). Refused, as sdk::ConfigError at `origin` naming
//   the field and its value: text that is not a JSON object; a missing or ill-typed field above;
//   and every field that makes the adapter compute other than W·x + (alpha / r)·B·A·dropout(x) on
//   the targets, or puts tensors beside lora_A and lora_B: bias other than "none", modules_to_save,
//   layers_to_transform, exclude_modules and layer_replication other than null (or empty),
//   rank_pattern and alpha_pattern other than empty, use_rslora, use_dora and lora_bias other than
//   false. Fields that do not change the function are not read (task_type, inference_mode,
//   init_lora_weights, fan_in_fan_out: the base weight's layout; PEFT keeps lora_A and lora_B as
//   nn.Linear whatever the base module is).
// - peft_targets() is PEFT 0.4's rule for whether a module gets adapters: a list adapts every
//   module whose name ends with one of its entries, a string every module whose name it matches
//   whole (std::regex's ECMAScript grammar standing in for Python's re, run by libstdc++'s
//   polynomial matcher). The parse refuses an expression it cannot read, one longer than 1,000
//   characters or with a number of more than 9 digits (libstdc++'s compiler recurses per
//   character and reads numbers unchecked), a back-reference, and Python's anchors \A, \Z and
//   \z, which ECMAScript reads as letters. A file nesting deeper than 32 levels is refused as it
//   parses (checkpoint/saved_folder.h).
// - peft_module_name() is the module a node is in PEFT's model: for a gpt-preset model
//   (GPT2LMHeadModel) its blocks, embeddings and final norm are under "transformer.", lm_head
//   beside it; any other model's nodes are modules of their own name. peft_tensor_name() names an
//   adapter's tensor as PEFT's get_peft_model_state_dict does: "base_model.model.<module>.lora_A
//   .weight" ([r, in]) and ".lora_B.weight" ([out, r]).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mixtrain::core {

inline constexpr std::string_view kPeftConfigFile = "adapter_config.json";
inline constexpr std::string_view kPeftWeightsFile = "adapter_model.safetensors";
inline constexpr std::string_view kPeftPickleWeightsFile = "adapter_model.bin";
inline constexpr std::string_view kPeftTensorPrefix = "base_model.model.";

// How to use a PEFT adapter folder where mixtrain met one as something else (a checkpoint, a
// model folder): the hint of that error. `folder` is the adapter's, as the user named it.
std::string peft_adapter_route(const std::string& folder);

struct PeftAdapterConfig {
  std::int64_t r = 0;
  double alpha = 0.0, dropout = 0.0;
  std::vector<std::string> target_names;  // a list's entries
  std::optional<std::string> target_regex;
  std::string base_model;  // base_model_name_or_path; empty when null
  // target_modules as the file writes it, for messages.
  std::string targets_text;
};

PeftAdapterConfig parse_peft_adapter_config(std::string_view text, const std::string& origin);

struct PeftAdapterFolder {
  PeftAdapterConfig config;
  std::filesystem::path config_file;   // <folder>/adapter_config.json
  std::filesystem::path weights_file;  // <folder>/adapter_model.safetensors
};

PeftAdapterFolder open_peft_adapter(const std::filesystem::path& folder);

// "the base model it was trained on", naming base_model_name_or_path when the file gives one:
// the hints of an adapter that does not fit the model.
std::string peft_base_model_text(const PeftAdapterConfig& config);

bool peft_targets(const PeftAdapterConfig& config, const std::string& module);

std::string peft_module_name(const std::string& node, bool gpt);

enum class LoraFactor { a, b };
std::string peft_tensor_name(const std::string& module, LoraFactor factor);

}  // namespace mixtrain::core
