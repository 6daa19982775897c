// What `mixtrain export` writes, whatever the weights come from (a checkpoint, or a config's
// initial weights with --initial): the metadata other tools can use and the gpt2 layout.
//
// Contract
// - exported_metadata() keeps, of a mixtrain training state's metadata, format = "pt",
//   mixtrain.version, step (from progress), policy (its component name), mixtrain.config (the
//   resolved TOML), normalization and escalation (the ops escalation promoted, which eval,
//   predict and sample of the export apply); everything else (sampler, scaler and optimizer
//   states) stays behind. The export command adds mixtrain.weights (master or ema).
// - in_gpt2_layout() keeps the weights ("param/", "buffer/" and plain names, renamed to plain
//   names) as Hugging Face GPT2Model's state dict, and adds layout = "gpt2" and the sizes to the
//   metadata (n_head when the carried config names it). A state that is not a gpt-preset model's,
//   or is in the gpt2 layout already, is sdk::CheckpointError / sdk::UserError naming `source`.
// - in_hf_folder() is in_gpt2_layout() under GPT2LMHeadModel's names, with the config.json of a
//   Hugging Face model folder (core/checkpoint/hf_folder.h) for weights written in `stored`. The
//   model config comes from the metadata (before anything is converted, so an MLP or a ResNet is
//   refused naming its kind); the weights' metadata says format = "pt", which from_pretrained
//   requires, whatever the source carried.
// - initial_weights_of() is the carried config's checkpoint.init_from (the file the run started
//   from, model.from_pretrained's weights included), or empty.
// - evaluated_weights() is the run's eval.weights as the carried config says ("master" when it
//   says nothing): which weights eval, predict and sample use. with_ema_weights() writes each
//   "ema/<name>" tensor's values over its parameter ("param/<name>", or <name> in a safetensors
//   checkpoint), so that every layout exports the averaged model; sdk::UserError naming `source`
//   when the state holds no EMA, sdk::CheckpointError when an average does not fit its parameter.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "mixtrain/sdk/checkpoint_format.h"
#include "mixtrain/sdk/dtype.h"

namespace mixtrain::cli {

std::map<std::string, std::string> exported_metadata(const std::map<std::string, std::string>& m);

// The resolved config a state carries: "config" in a checkpoint, "mixtrain.config" in an
// export; nullptr when it carries none.
const std::string* carried_config(const std::map<std::string, std::string>& metadata);
std::string evaluated_weights(const sdk::TrainingState& state);
std::filesystem::path initial_weights_of(const sdk::TrainingState& state);
bool has_ema_weights(const sdk::TrainingState& state);  // any "ema/<name>" tensor
sdk::TrainingState with_ema_weights(sdk::TrainingState state, const std::filesystem::path& source);

sdk::TrainingState in_gpt2_layout(sdk::TrainingState state, const std::filesystem::path& source);

struct HfFolderExport {
  sdk::TrainingState state;              // model.safetensors
  std::string config_json;               // config.json
  std::vector<std::string> zero_biases;  // GPT-2 biases the model has not (bias = false)
};
HfFolderExport in_hf_folder(sdk::TrainingState state, const std::filesystem::path& source,
                            sdk::DType stored);

// The tensors of `state` that are weights: "param/...", "buffer/..." and plain names.
std::size_t weight_tensor_count(const sdk::TrainingState& state);
// `state` with those tensors alone: an export holds one set of weights, never the optimizer's
// moments or the EMA (with_ema_weights() has written it over the weights when it is the one).
sdk::TrainingState only_weights(sdk::TrainingState state);

}  // namespace mixtrain::cli
