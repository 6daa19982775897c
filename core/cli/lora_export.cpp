// LoRA adapters out of mixtrain: see lora_export.h for the contract.
#include "lora_export.h"

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "exported_weights.h"
#include "mixtrain/core/checkpoint/hf_folder.h"
#include "mixtrain/core/checkpoint/peft_adapter.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/host_schemas.h"
#include "mixtrain/core/graph/freezing.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::cli {

namespace {

constexpr std::string_view kA = ".lora_A.weight", kB = ".lora_B.weight";

std::string plain_name(const std::string& name) {
  return name.rfind("param/", 0) == 0 ? name.substr(6) : name;
}

// The node an adapter tensor belongs beside ("h.0.attn.c_attn"), or empty.
std::string target_of(const std::string& name, std::string_view suffix) {
  const std::string plain = plain_name(name);
  if (name.find('/') != std::string::npos && name.rfind("param/", 0) != 0) return {};
  if (plain.size() <= suffix.size() ||
      plain.compare(plain.size() - suffix.size(), suffix.size(), suffix) != 0)
    return {};
  return plain.substr(0, plain.size() - suffix.size());
}

struct LoraSettings {
  std::int64_t r = 0;
  double alpha = 0, dropout = 0;
  bool gpt = false;  // the gpt preset: GPT2LMHeadModel's module names
  std::string base;  // the folder the run started from, when it did
};

double number(const sdk::OptionValue& v) {
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* i = std::get_if<std::int64_t>(&v)) return static_cast<double>(*i);
  return 0.0;
}

LoraSettings settings_of(const sdk::TrainingState& state, const std::filesystem::path& source) {
  const auto it = state.metadata.find("mixtrain.config");
  const std::string hint =
      "export a checkpoint (or --initial config) of a run with [model.lora] adapters";
  if (it == state.metadata.end())
    throw sdk::UserError(source.string() + " carries no config, so its LoRA settings are unknown",
                         hint);
  const auto config = core::Config::from_string(it->second, source.string() + " (its config)");
  LoraSettings s;
  for (const auto& o : config.table_options("model.lora", {"targets"})) {
    if (o.key == "r") {
      // In range before the cast (a damaged config's 1e300 is undefined behaviour to convert).
      const double r = number(o.value);
      s.r = r >= 1 && r <= 65536 ? static_cast<std::int64_t>(r) : 0;
    }
    if (o.key == "alpha") s.alpha = number(o.value);
    if (o.key == "dropout") s.dropout = number(o.value);
  }
  if (s.r < 1 || s.alpha <= 0)
    throw sdk::UserError(source.string() + "'s config has no [model.lora]: no adapters to export",
                         hint);
  for (const auto& o : config.table_options("model", core::model_list_keys()))
    if (o.key == "preset" && std::holds_alternative<std::string>(o.value))
      s.gpt = std::get<std::string>(o.value) == "gpt";
  for (const auto& o : config.table_options("checkpoint"))
    if (o.key == "init_from" && std::holds_alternative<std::string>(o.value)) {
      const std::filesystem::path from = std::get<std::string>(o.value);
      if (from.filename() == "model.safetensors") s.base = from.parent_path().string();
    }
  return s;
}

std::vector<float> floats(const sdk::HostTensor& t, const std::filesystem::path& source) {
  if (t.dtype != sdk::DType::fp32)
    throw sdk::CheckpointError(source.string() + ": '" + t.name + "' is not fp32",
                               "LoRA exports read mixtrain's FP32 weights; export a checkpoint");
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  std::memcpy(v.data(), t.bytes.data(), v.size() * sizeof(float));
  return v;
}

// Each target's A and B, checked against each other.
struct Adapter {
  const sdk::HostTensor *a = nullptr, *b = nullptr;
};

std::map<std::string, Adapter> adapters_of(const sdk::TrainingState& state,
                                           const std::filesystem::path& source) {
  std::map<std::string, Adapter> out;
  for (const auto& t : state.tensors) {
    if (auto n = target_of(t.name, kA); !n.empty()) out[n].a = &t;
    if (auto n = target_of(t.name, kB); !n.empty()) out[n].b = &t;
  }
  for (const auto& [node, ad] : out)
    if (ad.a == nullptr || ad.b == nullptr || ad.a->shape.size() != 2 || ad.b->shape.size() != 2 ||
        ad.a->shape[0] != ad.b->shape[1])
      throw sdk::CheckpointError(
          source.string() + ": the adapters of '" + node + "' are not a pair lora_A [r, in], " +
              "lora_B [out, r]",
          "the file is damaged or not mixtrain's; export the run's own checkpoint");
  if (out.empty())
    throw sdk::UserError(source.string() + " holds no LoRA adapters (no <node>.lora_A.weight)",
                         "export a checkpoint of a run with [model.lora]");
  return out;
}

// The parameters a state holds, by name ("h.0.ln_1.weight"): "param/<name>" in a native
// checkpoint, the plain name in a safetensors one (whose other entries, optimizer and EMA state,
// hold a '/').
std::vector<std::string> parameter_names(const sdk::TrainingState& state) {
  std::vector<std::string> out;
  for (const auto& t : state.tensors)
    if (t.name.rfind("param/", 0) == 0 || t.name.find('/') == std::string::npos)
      out.push_back(plain_name(t.name));
  return out;
}

bool is_adapter(const std::string& name) {
  return !target_of(name, kA).empty() || !target_of(name, kB).empty();
}

// What [train] trainable / frozen, as the carried config says, let train besides the adapters:
// the same resolution the run made (graph/freezing.h), over the state's parameters.
std::vector<std::string> trained_by_config(const sdk::TrainingState& state,
                                           const std::filesystem::path& source) {
  const std::string* text = carried_config(state.metadata);
  if (text == nullptr) return {};
  // An --initial export (step 0) has trained nothing yet.
  if (const auto step = state.metadata.find("step");
      step != state.metadata.end() && step->second == "0")
    return {};
  const auto config = core::Config::from_string(*text, source.string() + " (its config)");
  core::FreezeSpec spec;
  const auto add = [](std::vector<core::ParameterPattern>& list, const std::string& pattern,
                      const std::string& key) {
    core::ParameterPattern p;
    p.pattern = pattern;
    p.key = key;
    list.push_back(std::move(p));
  };
  for (const auto& pattern : config.string_array("train.trainable"))
    add(spec.trainable, pattern, "train.trainable");
  if (spec.trainable.empty()) return {};  // the adapters alone ([model.lora] adds them)
  for (const auto& pattern : config.string_array("train.frozen"))
    add(spec.frozen, pattern, "train.frozen");
  std::vector<core::NamedParameter> parameters;
  for (const auto& name : parameter_names(state)) {
    if (is_adapter(name)) add(spec.trainable, name, "model.lora");
    parameters.push_back({name.substr(0, name.rfind('.')), name});
  }
  std::set<std::string> frozen;
  try {
    const auto names = core::resolve_frozen(spec, parameters);
    frozen.insert(names.begin(), names.end());
  } catch (const sdk::ConfigError&) {
    // A pattern that matches none of these parameters: not the state the config trained.
    return {};
  }
  std::vector<std::string> out;
  for (const auto& p : parameters)
    if (!is_adapter(p.name) && !frozen.contains(p.name)) out.push_back(p.name);
  return out;
}

// The parameters besides the adapters that trained ([train] trainable beside [model.lora]): a
// checkpoint's "resume" entry lists the frozen ones ("frozen" absent: none); a state without it
// (an export of a checkpoint, which drops it) is judged by its carried config. Empty when the
// state says neither, or that nothing else trained (an export at step 0).
std::vector<std::string> trained_besides_adapters(const sdk::TrainingState& state,
                                                  const std::filesystem::path& source) {
  // A weights-only file (a safetensors checkpoint) names buffers as plainly as parameters: only
  // its config tells what trained.
  const auto weights_only = state.metadata.find("mixtrain.weights_only");
  const auto it = state.metadata.find("resume");
  if (it == state.metadata.end() ||
      (weights_only != state.metadata.end() && weights_only->second == "1"))
    return trained_by_config(state, source);
  const auto terms = nlohmann::json::parse(it->second, nullptr, false);
  if (!terms.is_object()) return trained_by_config(state, source);
  std::set<std::string> frozen;
  if (const auto f = terms.find("frozen"); f != terms.end() && f->is_array())
    for (const auto& name : *f)
      if (name.is_string()) frozen.insert(name.get<std::string>());
  std::vector<std::string> out;
  for (const auto& t : state.tensors) {
    if (t.name.rfind("param/", 0) != 0) continue;  // buffers are "buffer/<name>"
    const std::string name = plain_name(t.name);
    if (!is_adapter(name) && !frozen.count(name)) out.push_back(name);
  }
  return out;
}

}  // namespace

bool has_lora_adapters(const sdk::TrainingState& state) {
  for (const auto& t : state.tensors)
    if (!target_of(t.name, kA).empty()) return true;
  return false;
}

void refuse_training_beyond_adapters(const sdk::TrainingState& checkpoint,
                                     const std::filesystem::path& source) {
  // A run without adapters is told that first: every parameter it trained is "besides" them.
  // The whole model's export is offered in the layout that takes it: --layout hf writes only a
  // gpt-preset model (checkpoint/hf_folder.h refuses the others).
  if (!has_lora_adapters(checkpoint)) {
    bool gpt = false;
    try {
      (void)core::hf_gpt2_model(checkpoint.metadata, source.string());
      gpt = true;
    } catch (const sdk::UserError&) {
      // not a gpt-preset model's (or no config to tell): the plain export takes any model
    }
    throw sdk::UserError(source.string() +
                             " holds no LoRA adapters (its run had no [model.lora]): no adapters "
                             "to export",
                         "export a checkpoint (or --initial config) of a run with [model.lora] "
                         "adapters, or the whole model " +
                             std::string(gpt ? "with --layout hf (a Hugging Face GPT-2 folder)"
                                             : "with --format safetensors and no --layout "
                                               "(mixtrain's names; --layout hf takes gpt-preset "
                                               "models only)"));
  }
  const auto trained = trained_besides_adapters(checkpoint, source);
  if (trained.empty()) return;
  std::string names;
  for (std::size_t i = 0; i < trained.size() && i < 4; ++i) names += (i ? ", " : "") + trained[i];
  if (trained.size() > 4) names += ", … (" + std::to_string(trained.size()) + " in all)";
  throw sdk::UserError(
      source.string() + " trained parameters besides the adapters (" + names +
          "), which an adapter folder cannot carry: PEFT would load the base model's values "
          "for them",
      "export the whole fine-tuned model with --merge-lora --layout hf, or train the adapters "
      "alone (no [train] trainable beside [model.lora])");
}

PeftExport in_peft_layout(sdk::TrainingState state, const std::filesystem::path& source) {
  const LoraSettings s = settings_of(state, source);
  const auto adapters = adapters_of(state, source);
  PeftExport out;
  std::vector<std::string> modules;
  for (const auto& [node, ad] : adapters) {
    const std::string module = core::peft_module_name(node, s.gpt);
    modules.push_back(module);
    for (const sdk::HostTensor* t : {ad.a, ad.b}) {
      floats(*t, source);  // FP32 or an error
      sdk::HostTensor copy = *t;
      copy.name =
          core::peft_tensor_name(module, t == ad.a ? core::LoraFactor::a : core::LoraFactor::b);
      out.state.tensors.push_back(std::move(copy));
    }
  }
  out.state.metadata["format"] = "pt";
  for (const char* key : {"mixtrain.version", "step", "mixtrain.config"})
    if (auto it = state.metadata.find(key); it != state.metadata.end())
      out.state.metadata[key] = it->second;
  // PEFT keeps the alpha of its LoraConfig as given; an integral one is written as an integer.
  const bool integral = s.alpha < 9.0e15 && s.alpha == std::floor(s.alpha);  // exact in a double
  const nlohmann::json alpha =
      integral ? nlohmann::json(static_cast<std::int64_t>(s.alpha)) : nlohmann::json(s.alpha);
  nlohmann::json config = {
      {"peft_type", "LORA"},
      {"task_type", s.gpt ? nlohmann::json("CAUSAL_LM") : nlohmann::json(nullptr)},
      {"base_model_name_or_path",
       s.base.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.base)},
      {"revision", nullptr},
      {"inference_mode", true},
      {"r", s.r},
      {"lora_alpha", alpha},
      {"lora_dropout", s.dropout},
      {"fan_in_fan_out", s.gpt},
      {"bias", "none"},
      {"target_modules", modules},
      {"modules_to_save", nullptr},
      {"init_lora_weights", true},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
  };
  out.config_json = config.dump(2) + "\n";
  out.adapters = adapters.size();
  return out;
}

sdk::TrainingState merge_lora(sdk::TrainingState state, const std::filesystem::path& source) {
  const LoraSettings s = settings_of(state, source);
  const double scale = s.alpha / static_cast<double>(s.r);
  const auto adapters = adapters_of(state, source);
  std::set<std::string> dropped;
  for (const auto& [node, ad] : adapters) {
    sdk::HostTensor* w = nullptr;
    for (auto& t : state.tensors)
      if (t.name == "param/" + node + ".weight" || t.name == node + ".weight") w = &t;
    const std::int64_t r = ad.a->shape[0], in = ad.a->shape[1], out = ad.b->shape[0];
    // No weight of its own: the node reads another's (GPT-2's lm_head is wte's). Merging there
    // would change that one too, the input embeddings for lm_head, which no plain model can hold.
    if (w == nullptr)
      throw sdk::UserError(
          source.string() + ": '" + node +
              "' has adapters but no weight of its own: it is tied to "
              "another parameter (GPT-2's lm_head reads wte), so merging would change that "
              "parameter as well",
          "hand the adapters to PEFT with --layout peft, or leave the tied node out of "
          "[model.lora] targets");
    if (w == nullptr || w->shape != std::vector<std::int64_t>{out, in})
      throw sdk::CheckpointError(
          source.string() + ": no weight [" + std::to_string(out) + ", " + std::to_string(in) +
              "] for the adapters of '" + node + "' to merge into",
          "the file is damaged or not mixtrain's; export the run's own checkpoint");
    const auto a = floats(*ad.a, source), b = floats(*ad.b, source);
    auto merged = floats(*w, source);
    for (std::int64_t o = 0; o < out; ++o)
      for (std::int64_t i = 0; i < in; ++i) {
        double sum = 0;
        for (std::int64_t k = 0; k < r; ++k) sum += double(b[o * r + k]) * a[k * in + i];
        auto& v = merged[static_cast<std::size_t>(o * in + i)];
        v = static_cast<float>(double(v) + scale * sum);
      }
    std::memcpy(w->bytes.data(), merged.data(), merged.size() * sizeof(float));
    dropped.insert(node + ".lora_A.weight");
    dropped.insert(node + ".lora_B.weight");
  }
  // The adapters go, and whatever else names them (optimizer state, EMA).
  std::erase_if(state.tensors, [&](const sdk::HostTensor& t) {
    for (const auto& d : dropped)
      if (t.name.size() >= d.size() && t.name.find(d) != std::string::npos) return true;
    return false;
  });
  return state;
}

}  // namespace mixtrain::cli
