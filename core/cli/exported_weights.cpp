#include "exported_weights.h"

#include <cstdint>
#include <exception>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "mixtrain/core/checkpoint/gpt2_layout.h"
#include "mixtrain/core/checkpoint/hf_folder.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::cli {

namespace {

// n_head of [model.gpt] in the resolved config a checkpoint carries; 0 when it has none. The
// tensors give every other size, the head count only the config.
std::int64_t configured_heads(const std::map<std::string, std::string>& metadata) {
  const auto it = metadata.find("mixtrain.config");
  if (it == metadata.end()) return 0;
  try {
    const auto config = core::Config::from_string(it->second, "the checkpoint's config");
    for (const auto& o : config.table_options("model.gpt"))
      if (o.key == "n_head" && std::holds_alternative<std::int64_t>(o.value))
        return std::get<std::int64_t>(o.value);
  } catch (const std::exception&) {
    // a config this build cannot read: the file goes without n_head
  }
  return 0;
}

bool is_weight(const std::string& name) {
  return name.rfind("param/", 0) == 0 || name.rfind("buffer/", 0) == 0 ||
         name.find('/') == std::string::npos;
}

}  // namespace

// A mixtrain checkpoint's metadata is the whole training state; exported files carry the part
// other tools can use.
std::map<std::string, std::string> exported_metadata(const std::map<std::string, std::string>& m) {
  std::map<std::string, std::string> meta;
  meta["format"] = "pt";  // what Hugging Face loaders expect of PyTorch weights
  if (auto it = m.find("mixtrain.version"); it != m.end()) meta["mixtrain.version"] = it->second;
  if (auto it = m.find("progress"); it != m.end()) {
    auto j = nlohmann::json::parse(it->second, nullptr, false);
    if (j.is_object() && j.contains("step")) meta["step"] = j["step"].dump();
  }
  if (auto it = m.find("policy"); it != m.end()) {
    auto j = nlohmann::json::parse(it->second, nullptr, false);
    if (j.is_object() && j.contains("component") && j["component"].is_string()) {
      meta["policy"] = j["component"].get<std::string>();
      // The policy's state (delayed scaling's amax histories and scales): eval, predict and
      // sample of the export scale as eval of the checkpoint does, not from scales of 1.
      meta["mixtrain.policy_state"] = it->second;
    }
  }
  if (auto it = m.find("config"); it != m.end()) meta["mixtrain.config"] = it->second;
  // {"mean": [...], "std": [...]} per channel: the Normalize the weights were trained behind.
  if (auto it = m.find("normalization"); it != m.end()) meta["normalization"] = it->second;
  // A table or image model's input shape and classes: predict of the export builds the model
  // without the data files.
  if (auto it = m.find("data_shape"); it != m.end()) meta["data_shape"] = it->second;
  // The ops escalation promoted: eval, predict and sample of the export run them as the run did
  // from then on (an fp16 op that overflowed would overflow again).
  if (auto it = m.find("escalation"); it != m.end()) meta["escalation"] = it->second;
  return meta;
}

namespace {

// A string value of the carried config, or empty when there is none or the config cannot be
// read by this build.
std::string carried_string(const sdk::TrainingState& state, const std::string& table,
                           const std::string& key) {
  const std::string* text = carried_config(state.metadata);
  if (text == nullptr) return {};
  try {
    const auto config = core::Config::from_string(*text, "the checkpoint's config");
    for (const auto& o : config.table_options(table))
      if (o.key == key && std::holds_alternative<std::string>(o.value))
        return std::get<std::string>(o.value);
  } catch (const std::exception&) {
    // a config this build cannot read: as if it said nothing
  }
  return {};
}

}  // namespace

const std::string* carried_config(const std::map<std::string, std::string>& metadata) {
  for (const char* entry : {"config", "mixtrain.config"})
    if (const auto it = metadata.find(entry); it != metadata.end()) return &it->second;
  return nullptr;
}

std::string evaluated_weights(const sdk::TrainingState& state) {
  const std::string weights = carried_string(state, "eval", "weights");
  return weights.empty() ? "master" : weights;  // a run without [ema] evaluates its masters
}

std::filesystem::path initial_weights_of(const sdk::TrainingState& state) {
  return carried_string(state, "checkpoint", "init_from");
}

bool has_ema_weights(const sdk::TrainingState& state) {
  for (const auto& t : state.tensors)
    if (t.name.rfind("ema/", 0) == 0) return true;
  return false;
}

sdk::TrainingState with_ema_weights(sdk::TrainingState state, const std::filesystem::path& source) {
  std::map<std::string, sdk::HostTensor*> parameters;
  for (auto& t : state.tensors) {
    if (t.name.rfind("param/", 0) == 0)
      parameters[t.name.substr(6)] = &t;
    else if (t.name.find('/') == std::string::npos)
      parameters[t.name] = &t;
  }
  std::size_t averaged = 0;
  for (const auto& t : state.tensors) {
    if (t.name.rfind("ema/", 0) != 0) continue;
    const auto it = parameters.find(t.name.substr(4));
    if (it == parameters.end() || it->second->dtype != t.dtype || it->second->shape != t.shape)
      throw sdk::CheckpointError(
          source.string() + ": the average '" + t.name +
              "' has no parameter of its dtype and shape",
          "the file is damaged or not mixtrain's; export the run's own checkpoint, or pass "
          "--weights master");
    it->second->bytes = t.bytes;
    ++averaged;
  }
  if (averaged == 0)
    throw sdk::UserError(
        source.string() + " holds no EMA weights (no ema/ tensors): its run kept none ([ema] "
                          "absent), or wrote checkpoints in a format that keeps weights only, or "
                          "it is an export, which holds one set (its metadata's mixtrain.weights "
                          "says which)",
        "export a native checkpoint of a run with [ema], or drop --weights ema");
  return state;
}

sdk::TrainingState in_gpt2_layout(sdk::TrainingState state, const std::filesystem::path& source) {
  if (auto it = state.metadata.find("layout"); it != state.metadata.end() && it->second == "gpt2")
    throw sdk::UserError(source.string() + " is in the gpt2 layout already (its metadata says so)",
                         "export it with --layout native, or use it as it is");
  std::vector<sdk::HostTensor> weights;
  for (auto& t : state.tensors) {
    if (!is_weight(t.name)) continue;  // optimizer state, EMA, ...
    if (t.name.rfind("param/", 0) == 0)
      t.name.erase(0, 6);
    else if (t.name.rfind("buffer/", 0) == 0)
      t.name.erase(0, 7);
    weights.push_back(std::move(t));
  }
  state.tensors = core::to_gpt2_layout(std::move(weights), source.string());
  const auto sizes = core::gpt2_sizes(state.tensors);
  auto& meta = state.metadata;
  meta["layout"] = "gpt2";
  meta["n_layer"] = std::to_string(sizes.n_layer);
  meta["n_embd"] = std::to_string(sizes.n_embd);
  meta["vocab_size"] = std::to_string(sizes.vocab_size);
  meta["n_positions"] = std::to_string(sizes.n_positions);
  if (const auto heads = configured_heads(meta); heads > 0) meta["n_head"] = std::to_string(heads);
  return state;
}

HfFolderExport in_hf_folder(sdk::TrainingState state, const std::filesystem::path& source,
                            sdk::DType stored) {
  const auto model = core::hf_gpt2_model(state.metadata, source.string());
  state = in_gpt2_layout(std::move(state), source);
  auto folder = core::hf_gpt2_folder(std::move(state.tensors), model, stored, source.string());
  state.tensors = std::move(folder.tensors);
  // from_pretrained refuses a model.safetensors without it, whatever the source file carried.
  state.metadata["format"] = "pt";
  return {std::move(state), std::move(folder.config_json), std::move(folder.zero_biases)};
}

std::size_t weight_tensor_count(const sdk::TrainingState& state) {
  std::size_t n = 0;
  for (const auto& t : state.tensors)
    if (is_weight(t.name)) ++n;
  return n;
}

sdk::TrainingState only_weights(sdk::TrainingState state) {
  std::erase_if(state.tensors, [](const sdk::HostTensor& t) { return !is_weight(t.name); });
  return state;
}

}  // namespace mixtrain::cli
