// What `mixtrain export` does with LoRA adapters ([model.lora], core graph/lora.h): hands them to
// PEFT as an adapter folder (--layout peft), or merges them into the base weights
// (--merge-lora).
//
// Contract
// - The settings come from the resolved config the weights carry (metadata "mixtrain.config",
//   its [model.lora]); a state without adapter tensors, or without that config, is
//   sdk::UserError naming `source`.
// - in_peft_layout(): adapter_model.safetensors's tensors are the adapters alone, FP32, named as
//   PEFT 0.4's get_peft_model_state_dict names them: "base_model.model.<module>.lora_A.weight"
//   ([r, in]) and ".lora_B.weight" ([out, r]), <module> the node's name, under "transformer."
//   for a gpt-preset model's nodes other than lm_head (GPT2LMHeadModel's modules). PEFT keeps
//   lora_A / lora_B as nn.Linear for GPT-2's Conv1D too, so they are not transposed;
//   fan_in_fan_out = true (Conv1D's [in, out] base weight) is said in adapter_config.json for a
//   gpt-preset model. adapter_config.json: PEFT's LoraConfig (peft_type LORA, r, lora_alpha,
//   lora_dropout, bias "none", target_modules = the adapted modules' full names, task_type
//   CAUSAL_LM for a gpt-preset model).
// - refuse_training_beyond_adapters(): sdk::UserError when the state holds no adapter (a run
//   without [model.lora]), or when it trained parameters besides
//   the adapters ([train] trainable): PEFT would load the base model's values for them. A
//   checkpoint says so in its "resume" entry (which lists the frozen parameters, "param/<name>");
//   an exported file (no such entry) or a weights-only checkpoint (safetensors: buffers and
//   parameters under plain names) by its carried config's [train] trainable / frozen, resolved
//   over its tensors as the run did. A state at step 0, or one that says neither, passes.
// - merge_lora(): every base weight W [out, in] with adapters becomes W + (alpha / r)·B·A
//   (computed in double, rounded once to FP32), and the adapters' tensors (and their optimizer
//   state) are dropped, so the state is the plain model's. A node with adapters but no weight of
//   its own (tied: GPT-2's lm_head reads wte) is sdk::UserError.
// - has_lora_adapters(): whether the state holds any adapter tensor.
#pragma once

#include <filesystem>
#include <string>

#include "mixtrain/sdk/checkpoint_format.h"

namespace mixtrain::cli {

bool has_lora_adapters(const sdk::TrainingState& state);

struct PeftExport {
  sdk::TrainingState state;  // adapter_model.safetensors
  std::string config_json;   // adapter_config.json
  std::size_t adapters = 0;  // the adapted modules
};
PeftExport in_peft_layout(sdk::TrainingState state, const std::filesystem::path& source);
void refuse_training_beyond_adapters(const sdk::TrainingState& checkpoint,
                                     const std::filesystem::path& source);

sdk::TrainingState merge_lora(sdk::TrainingState state, const std::filesystem::path& source);

}  // namespace mixtrain::cli
