#include "mixtrain/core/checkpoint/hf_folder.h"

#include <exception>
#include <map>
#include <set>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "config/model_presets.h"
#include "mixtrain/core/checkpoint/gpt2_layout.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

namespace {

// GPT2LMHeadModel keeps GPT2Model under this attribute; save_pretrained prefixes its names.
constexpr std::string_view kPrefix = "transformer.";

// The preset's gelu node is the tanh approximation (graph/ops/activation.h), which transformers
// calls "gelu_new" (NewGELUActivation); its "gelu" is the exact erf form.
constexpr const char* kGeluTanh = "gelu_new";

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
  m.layer_norm_epsilon = kGptLayerNormEps;
  m.activation_function = kGeluTanh;
  m.dropout = kGptDropout;
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
  for (const auto& o : config.table_options("model"))
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
  for (const auto& o : config.table_options("model.gpt"))
    if (o.key == "n_head" && std::holds_alternative<std::int64_t>(o.value))
      m.n_head = std::get<std::int64_t>(o.value);
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
  std::int64_t n_inner = 4 * sizes.n_embd;
  for (auto& t : gpt2_tensors) {
    const std::string name = t.name;
    if (name.ends_with("mlp.c_fc.weight") && t.shape.size() == 2) n_inner = t.shape[1];
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

  // The keys save_pretrained writes for a GPT2LMHeadModel that mean something to this model;
  // transformers fills the rest (GPT2Config's defaults).
  nlohmann::ordered_json c;
  c["architectures"] = {"GPT2LMHeadModel"};
  c["model_type"] = "gpt2";
  c["vocab_size"] = sizes.vocab_size;
  c["n_positions"] = sizes.n_positions;
  c["n_ctx"] = sizes.n_positions;  // older configs' name of n_positions
  c["n_embd"] = sizes.n_embd;
  c["n_layer"] = sizes.n_layer;
  c["n_head"] = model.n_head;
  c["n_inner"] = n_inner;
  c["activation_function"] = model.activation_function;
  c["layer_norm_epsilon"] = model.layer_norm_epsilon;
  c["attn_pdrop"] = model.dropout;
  c["embd_pdrop"] = model.dropout;
  c["resid_pdrop"] = model.dropout;
  c["scale_attn_weights"] = true;  // softmax(q·k / sqrt(head size)), as the attention op
  c["tie_word_embeddings"] = true;
  // GPT-2's <|endoftext|> (50256) only where the vocabulary has it; a byte-level or smaller
  // model has no such token, and null keeps generate() from assuming one.
  const bool gpt2_vocab = sizes.vocab_size > 50256;
  c["bos_token_id"] = gpt2_vocab ? nlohmann::ordered_json(50256) : nullptr;
  c["eos_token_id"] = gpt2_vocab ? nlohmann::ordered_json(50256) : nullptr;
  c["torch_dtype"] = torch_dtype;
  out.config_json = c.dump(2) + "\n";
  return out;
}

}  // namespace mixtrain::core
