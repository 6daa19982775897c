#include "mixtrain/core/checkpoint/hf_folder.h"

#include <exception>
#include <map>
#include <set>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "checkpoint/saved_folder.h"
#include "config/model_presets.h"
#include "mixtrain/core/checkpoint/gpt2_layout.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/host_schemas.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

std::optional<std::int64_t> gpt2_token_id(std::optional<std::int64_t> stated,
                                          std::int64_t vocab_size) {
  constexpr std::int64_t kEndOfText = 50256;
  if (!stated || *stated == -2)
    return vocab_size > kEndOfText ? std::optional<std::int64_t>(kEndOfText) : std::nullopt;
  return *stated >= 0 ? stated : std::nullopt;
}

namespace {

// GPT2LMHeadModel keeps GPT2Model under this attribute; save_pretrained prefixes its names.
constexpr std::string_view kPrefix = "transformer.";

using Json = nlohmann::ordered_json;

// The preset's sizes under GPT2Config's names: what config_json writes of them and what
// parse_hf_gpt2_config reads back. [model.gpt]'s block_size is GPT-2's n_positions.
struct SizeField {
  const char* key;    // [model.gpt]
  const char* field;  // config.json
};
constexpr SizeField kSizeFields[] = {{"n_layer", "n_layer"},
                                     {"n_head", "n_head"},
                                     {"n_embd", "n_embd"},
                                     {"vocab_size", "vocab_size"},
                                     {"block_size", "n_positions"}};

// What the preset fixes rather than configures, as GPT2Config fields: written as the preset's
// value, and read back only when equal to it (GPT2Config's default stands in for an absent
// field), since any other value computes another function.
struct FixedField {
  const char* field;
  Json preset;       // the preset's value
  Json absent;       // GPT2Config's default
  const char* what;  // what the preset computes, for the refusal
  Json same = {};    // another value that computes the same function (null: none)
};

const std::vector<FixedField>& fixed_fields() {
  // The preset's gelu node is the tanh approximation (graph/ops/activation.h), which
  // transformers calls "gelu_new" (NewGELUActivation) and also computes as "gelu_pytorch_tanh"
  // (torch's gelu(approximate="tanh")); its "gelu" is the exact erf form.
  static const std::vector<FixedField> fields = {
      {"activation_function", "gelu_new", "gelu_new",
       "the tanh approximation of GELU, transformers' \"gelu_new\"", "gelu_pytorch_tanh"},
      {"layer_norm_epsilon", kGptLayerNormEps, 1e-5, "LayerNorms with eps = 1e-05"},
      {"scale_attn_weights", true, true, "attention scores scaled by 1/sqrt(head size)"},
      {"scale_attn_by_inverse_layer_idx", false, false,
       "the same attention scaling in every layer"},
      {"tie_word_embeddings", true, true, "lm_head tied to wte.weight"},
      {"add_cross_attention", false, false, "decoder blocks without cross-attention"},
  };
  return fields;
}

// The dropout probabilities GPT2Config has (0.1 when absent); the preset has none.
constexpr const char* kDropoutFields[] = {"attn_pdrop", "embd_pdrop", "resid_pdrop"};
constexpr double kGpt2ConfigDropout = 0.1;

// config.json of a gpt-preset model: the fields that mean something to it (the sizes, what the
// preset fixes, no dropout), the token ids and the dtype; transformers fills the rest with
// GPT2Config's defaults.
std::string config_json(const std::map<std::string, std::int64_t>& sizes, const HfGpt2Model& model,
                        const char* torch_dtype) {
  Json c;
  c["architectures"] = {"GPT2LMHeadModel"};
  c["model_type"] = "gpt2";
  for (const auto& f : kSizeFields) c[f.field] = sizes.at(f.key);
  c["n_ctx"] = sizes.at("block_size");  // older configs' name of n_positions
  c["n_inner"] = 4 * sizes.at("n_embd");
  for (const auto& f : fixed_fields()) c[f.field] = f.preset;
  for (const char* f : kDropoutFields) c[f] = kGptDropout;
  // The model's own ids (from_pretrained copies its folder's); null keeps generate() from
  // assuming one the vocabulary lacks.
  const auto id = [&](const std::optional<std::int64_t>& stated) {
    const auto resolved = gpt2_token_id(stated, sizes.at("vocab_size"));
    return resolved ? Json(*resolved) : Json(nullptr);
  };
  c["bos_token_id"] = id(model.bos_token_id);
  c["eos_token_id"] = id(model.eos_token_id);
  c["torch_dtype"] = torch_dtype;
  return c.dump(2) + "\n";
}

const char* torch_dtype_name(sdk::DType t) {
  switch (t) {
    case sdk::DType::fp32:
      return "float32";
    case sdk::DType::bf16:
      return "bfloat16";
    case sdk::DType::fp16:
      return "float16";
    default:
      return nullptr;
  }
}

// What a bias = false layer lacks, beside the weight it belongs to: a LayerNorm's bias has its
// weight's shape, a Conv1D's [in, out] weight a bias of [out].
std::vector<std::int64_t> bias_shape(const sdk::HostTensor& weight) {
  if (is_conv1d_weight(weight.name) && weight.shape.size() == 2) return {weight.shape[1]};
  return weight.shape;
}

}  // namespace

HfGpt2Model hf_gpt2_model(const std::map<std::string, std::string>& metadata,
                          const std::string& origin) {
  HfGpt2Model m;
  // An export's config, or a mixtrain checkpoint's own (another tool's "config" is not ours).
  auto it = metadata.find("mixtrain.config");
  if (it == metadata.end() && metadata.count("mixtrain.state_version"))
    it = metadata.find("config");
  if (it == metadata.end()) {
    // A GPT-2 file written elsewhere (e.g. by PyTorch) may state its head count.
    if (auto heads = metadata.find("n_head"); heads != metadata.end()) {
      try {
        m.n_head = std::stoll(heads->second);
      } catch (const std::exception&) {
        m.n_head = 0;
      }
    }
    if (m.n_head <= 0)
      throw sdk::UserError(
          origin +
              " carries no mixtrain config and no n_head: the head count of a Hugging "
              "Face config is not in the weights",
          "export a mixtrain checkpoint or export (they carry their config), or a file whose "
          "metadata has n_head");
    return m;
  }
  const auto config = Config::from_string(it->second, origin + "'s config");
  std::string preset;
  for (const auto& o : config.table_options("model", model_list_keys()))
    if (o.key == "preset" && std::holds_alternative<std::string>(o.value))
      preset = std::get<std::string>(o.value);
  if (preset != "gpt")
    throw sdk::UserError(
        "--layout hf writes a Hugging Face GPT-2 folder, which holds a gpt-preset model; " +
            origin + "'s model is " +
            (preset.empty() ? std::string("built from [model] layers/nodes")
                            : "the \"" + preset + "\" preset"),
        preset == "resnet"
            ? "export it without --layout: the safetensors export names a ResNet as "
              "torchvision does (model.load_state_dict(safetensors.torch.load_file(path)))"
            : "export it without --layout (safetensors in mixtrain's names)");
  for (const auto& o : config.table_options("model.gpt")) {
    if (!std::holds_alternative<std::int64_t>(o.value)) continue;
    const std::int64_t v = std::get<std::int64_t>(o.value);
    if (o.key == "n_head") m.n_head = v;
    if (o.key == "bos_token_id") m.bos_token_id = v;
    if (o.key == "eos_token_id") m.eos_token_id = v;
  }
  if (m.n_head <= 0)
    throw sdk::UserError(origin + "'s config has no [model.gpt] n_head",
                         "the head count is not in the weights; export a checkpoint of a run "
                         "whose config sets it");
  return m;
}

HfGpt2Folder hf_gpt2_folder(std::vector<sdk::HostTensor> gpt2_tensors, const HfGpt2Model& model,
                            sdk::DType stored, const std::string& origin) {
  const auto sizes = gpt2_sizes(gpt2_tensors);
  const char* torch_dtype = torch_dtype_name(stored);
  if (torch_dtype == nullptr)
    throw sdk::UserError(origin +
                             ": a Hugging Face folder's weights are float32, bfloat16 or "
                             "float16, not " +
                             std::string(sdk::dtype_name(stored)),
                         "export with --dtype fp32, bf16 or fp16");
  if (model.n_head <= 0 || sizes.n_embd % model.n_head != 0)
    throw sdk::UserError(origin + ": n_embd " + std::to_string(sizes.n_embd) +
                             " is not a multiple of n_head " + std::to_string(model.n_head),
                         "the config's [model.gpt] n_head does not fit these weights");

  HfGpt2Folder out;
  // Zero biases where the weight has none (bias = false), right after their weight so the file
  // keeps the model's order.
  std::set<std::string> names;
  for (const auto& t : gpt2_tensors) names.insert(t.name);
  for (auto& t : gpt2_tensors) {
    const std::string name = t.name;
    const bool weight = name.ends_with(".weight") && name != "wte.weight" && name != "wpe.weight";
    const std::string bias =
        weight ? name.substr(0, name.size() - std::string_view(".weight").size()) + ".bias" : "";
    std::vector<std::int64_t> shape;
    if (weight && !names.count(bias)) shape = bias_shape(t);
    const sdk::DType dtype = t.dtype;
    t.name = std::string(kPrefix) + name;
    out.tensors.push_back(std::move(t));
    if (!shape.empty()) {
      sdk::HostTensor zeros;
      zeros.name = std::string(kPrefix) + bias;
      zeros.dtype = dtype;  // 0.0 is all zero bits in every float format
      zeros.shape = shape;
      zeros.bytes.assign(static_cast<std::size_t>(zeros.numel()) * sdk::dtype_size(dtype),
                         std::byte{0});
      out.tensors.push_back(std::move(zeros));
      out.zero_biases.push_back(bias);
    }
  }

  out.config_json = config_json({{"n_layer", sizes.n_layer},
                                 {"n_head", model.n_head},
                                 {"n_embd", sizes.n_embd},
                                 {"vocab_size", sizes.vocab_size},
                                 {"block_size", sizes.n_positions}},
                                model, torch_dtype);
  return out;
}

namespace {

// A JSON integer that fits int64 (a larger unsigned one does not); nullopt for anything else.
std::optional<std::int64_t> as_int64(const Json& v) {
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() && v.get<std::uint64_t>() > std::uint64_t(INT64_MAX)))
    return std::nullopt;
  return v.get<std::int64_t>();
}

// A size as GPT2Config holds it: an integer >= 1 within [model.gpt]'s range for `key`.
std::int64_t read_size(const Json& c, const SizeField& f, const sdk::SourceLocation& at) {
  const auto it = c.find(f.field);
  if (it == c.end())
    throw sdk::ConfigError(at, f.field, "absent",
                           "a GPT-2 config.json states n_layer, n_head, n_embd, vocab_size and "
                           "n_positions; save it with transformers' save_pretrained");
  const auto read = as_int64(*it);
  if (!read) throw sdk::ConfigError(at, f.field, "expected an integer, got " + json_shown(*it));
  const std::int64_t value = *read;
  if (value < 1)
    throw sdk::ConfigError(at, f.field, "is " + std::to_string(value) + ", expected at least 1");
  // [model.gpt]'s own bounds, under config.json's name.
  for (auto spec : gpt_preset_schema())
    if (spec.name == f.key) {
      spec.name = f.field;
      sdk::Options::resolve("", {spec}, {{f.field, value, at}}, at);
    }
  return value;
}

}  // namespace

HfGpt2Config parse_hf_gpt2_config(std::string_view text, const std::string& origin) {
  const sdk::SourceLocation at{origin, 0, 0};
  const Json c = parse_saved_config<Json>(
      text, at, "a Hugging Face config.json is a JSON object (save_pretrained writes it)");
  if (!c.is_object())
    throw sdk::ConfigError(at, "", "expected a JSON object, got " + std::string(c.type_name()),
                           "a Hugging Face config.json is a JSON object of GPT2Config's fields");
  const auto type = c.find("model_type");
  if (type == c.end() || *type != "gpt2")
    throw sdk::ConfigError(
        at, "model_type",
        (type == c.end() ? std::string("absent") : "is " + json_shown(*type)) +
            ": from_pretrained reads GPT-2 folders (model_type \"gpt2\") only",
        "start from a GPT-2 model's folder (GPT2LMHeadModel.save_pretrained), or describe this "
        "model's graph in [model] nodes");

  HfGpt2Config out;
  std::map<std::string, std::int64_t> sizes;
  for (const auto& f : kSizeFields) {
    sizes[f.key] = read_size(c, f, at);
    out.sizes.push_back({f.key, f.field, sizes[f.key]});
  }
  const std::int64_t n_embd = sizes["n_embd"], n_head = sizes["n_head"];
  if (n_embd % n_head != 0)
    throw sdk::ConfigError(at, "n_head",
                           "n_embd = " + std::to_string(n_embd) +
                               " is not divisible by n_head = " + std::to_string(n_head),
                           "the gpt preset's heads are n_embd / n_head wide; this is not a model "
                           "it can build");
  if (const auto ctx = c.find("n_ctx"); ctx != c.end() && *ctx != sizes["block_size"])
    throw sdk::ConfigError(
        at, "n_ctx",
        "is " + json_shown(*ctx) + " but n_positions is " + std::to_string(sizes["block_size"]),
        "n_ctx is the older name of n_positions: make them agree or drop n_ctx");
  if (const auto inner = c.find("n_inner");
      inner != c.end() && !inner->is_null() && *inner != 4 * n_embd)
    throw sdk::ConfigError(at, "n_inner",
                           "is " + json_shown(*inner) + ": the gpt preset's MLP is 4·n_embd = " +
                               std::to_string(4 * n_embd) + " wide",
                           "the gpt preset cannot build this model; remove n_inner (null means "
                           "4·n_embd) only if the weights are 4·n_embd wide");
  for (const auto& f : fixed_fields()) {
    const auto it = c.find(f.field);
    const Json& value = it == c.end() ? f.absent : *it;
    if (value != f.preset && (f.same.is_null() || value != f.same))
      throw sdk::ConfigError(
          at, f.field,
          "is " + json_shown(value) + (it == c.end() ? " (GPT2Config's default)" : "") +
              ", but the gpt preset computes " + f.what + " (" + f.field + " = " + f.preset.dump() +
              ")",
          "the gpt preset cannot build this model; from_pretrained builds only what it computes "
          "exactly");
  }
  // GPT2Config reads an absent id as 50256; an id the vocabulary lacks, or null, is none (-1).
  for (const char* f : {"bos_token_id", "eos_token_id"}) {
    const auto it = c.find(f);
    std::int64_t id = 50256;
    if (it != c.end()) {
      if (const auto read = as_int64(*it)) {
        id = *read;
      } else {
        id = -1;
        // GPT2Config takes anything here (a list of ids, say); the export then names none.
        if (!it->is_null())
          out.notes.push_back(origin + ": " + f + " = " + json_shown(*it) +
                              " is not one token id; a Hugging Face export names none");
      }
    }
    if (id < 0 || id >= sizes["vocab_size"]) {
      // Not a token of this vocabulary (transformers' GPT2Config() keeps 50256 whatever
      // vocab_size is): said, since the export then names none where the folder named one.
      if (id >= 0)
        out.notes.push_back(origin + ": " + f + " = " + std::to_string(id) +
                            (it == c.end() ? " (GPT2Config's default)" : "") +
                            " is outside vocab_size " + std::to_string(sizes["vocab_size"]) +
                            "; the run has none and a Hugging Face export names none");
      id = -1;
    }
    out.token_ids.push_back({f, f, id});
  }
  for (const char* f : kDropoutFields) {
    const auto it = c.find(f);
    if (it != c.end() && !it->is_number())
      throw sdk::ConfigError(at, f, "expected a number, got " + json_shown(*it));
    const double p = it == c.end() ? kGpt2ConfigDropout : it->get<double>();
    if (p != kGptDropout)
      out.notes.push_back(origin + ": " + f + " = " + Json(p).dump() +
                          (it == c.end() ? " (GPT2Config's default)" : "") +
                          " is not applied: the gpt preset trains without dropout");
  }
  return out;
}

HfGpt2Pretrained open_hf_gpt2_folder(const std::filesystem::path& folder) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string text = read_saved_folder_config(
      folder, kHfConfigFile,
      "name a Hugging Face GPT-2 folder (config.json and model.safetensors, as save_pretrained "
      "writes it)",
      "a Hugging Face model folder holds config.json beside its weights "
      "(GPT2LMHeadModel.save_pretrained writes both)");
  HfGpt2Pretrained out;
  out.config_file = folder / kHfConfigFile;
  out.weights_file = folder / kHfWeightsFile;
  out.config = parse_hf_gpt2_config(text, out.config_file.string());
  if (fs::is_regular_file(out.weights_file, ec)) return out;
  const std::string resave =
      "load it with transformers and save it again as safetensors: "
      "GPT2LMHeadModel.from_pretrained(\"" +
      folder.string() + "\").save_pretrained(\"<new folder>\", safe_serialization=True" +
      std::string(fs::exists(folder / kHfShardIndexFile, ec) ? ", max_shard_size=\"100GB\"" : "") +
      ") (in the Python peers venv, ~/.cache/mixtrain/peers)";
  if (fs::exists(folder / kHfShardIndexFile, ec))
    throw sdk::UserError(folder.string() + " holds its weights in several safetensors shards (" +
                             std::string(kHfShardIndexFile) + "); from_pretrained reads one " +
                             std::string(kHfWeightsFile),
                         resave);
  if (fs::exists(folder / kHfPickleWeightsFile, ec))
    throw sdk::UserError(
        folder.string() + " holds its weights only in " + std::string(kHfPickleWeightsFile) +
            ", a Python pickle, which mixtrain does not read (unpickling runs arbitrary code)",
        resave);
  throw sdk::UserError(folder.string() + " has no " + std::string(kHfWeightsFile),
                       "from_pretrained reads the weights from model.safetensors beside "
                       "config.json; save them with save_pretrained(..., safe_serialization=True)");
}

}  // namespace mixtrain::core
