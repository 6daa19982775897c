// What `mixtrain export` writes, whatever the weights come from (a checkpoint, or a config's
// initial weights with --initial): the metadata other tools can use and the gpt2 layout.
//
// Contract
// - exported_metadata() keeps, of a mixtrain training state's metadata, format = "pt",
//   mixtrain.version, step (from progress), policy (its component name) and mixtrain.config (the
//   resolved TOML); everything else (sampler, scaler and optimizer states) stays behind.
// - in_gpt2_layout() keeps the weights ("param/", "buffer/" and plain names, renamed to plain
//   names) as Hugging Face GPT2Model's state dict, and adds layout = "gpt2" and the sizes to the
//   metadata (n_head when the carried config names it). A state that is not a gpt-preset model's,
//   or is in the gpt2 layout already, is sdk::CheckpointError / sdk::UserError naming `source`.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <string>

#include "mixtrain/sdk/checkpoint_format.h"

namespace mixtrain::cli {

std::map<std::string, std::string> exported_metadata(const std::map<std::string, std::string>& m);

sdk::TrainingState in_gpt2_layout(sdk::TrainingState state, const std::filesystem::path& source);

// The tensors of `state` that are weights: "param/...", "buffer/..." and plain names.
std::size_t weight_tensor_count(const sdk::TrainingState& state);

}  // namespace mixtrain::cli
