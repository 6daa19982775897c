#include "mixtrain/core/checkpoint/gpt2_layout.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include <filesystem>
#include "graph/ops/op_support.h"

#include "mixtrain/core/checkpoint/hf_folder.h"
#include "mixtrain/core/checkpoint/peft_adapter.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

namespace {

constexpr std::string_view kPrefix = "transformer.";

// The parts of block h.<i>, as GPT2Model names them; biases may be absent (bias = false).
constexpr std::string_view kLayerWeights[] = {"ln_1.weight",        "attn.c_attn.weight",
                                              "attn.c_proj.weight", "ln_2.weight",
                                              "mlp.c_fc.weight",    "mlp.c_proj.weight"};
constexpr std::string_view kLayerBiases[] = {"ln_1.bias", "attn.c_attn.bias", "attn.c_proj.bias",
                                             "ln_2.bias", "mlp.c_fc.bias",    "mlp.c_proj.bias"};
constexpr std::string_view kConv1d[] = {"attn.c_attn.weight", "attn.c_proj.weight",
                                        "mlp.c_fc.weight", "mlp.c_proj.weight"};
constexpr std::string_view kTopLevel[] = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"};

struct LayerName {
  std::int64_t index;
  std::string_view part;  // "attn.c_attn.weight"
};

// "h.<i>.<part>" with <i> a plain decimal (no sign, no leading zero), else nullopt.
std::optional<LayerName> layer_name(std::string_view name) {
  if (name.substr(0, 2) != "h.") return std::nullopt;
  const auto dot = name.find('.', 2);
  if (dot == std::string_view::npos || dot == 2 || dot > 12) return std::nullopt;
  const auto digits = name.substr(2, dot - 2);
  if (digits.size() > 1 && digits.front() == '0') return std::nullopt;
  std::int64_t index = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    index = index * 10 + (c - '0');
  }
  return LayerName{index, name.substr(dot + 1)};
}

template <std::size_t N>
bool one_of(std::string_view s, const std::string_view (&set)[N]) {
  return std::find(std::begin(set), std::end(set), s) != std::end(set);
}

bool is_gpt2_weight(std::string_view name) {
  if (one_of(name, kTopLevel)) return true;
  const auto l = layer_name(name);
  return l && (one_of(l->part, kLayerWeights) || one_of(l->part, kLayerBiases));
}

bool is_mask_buffer(std::string_view name) {
  const auto l = layer_name(name);
  return l && (l->part == "attn.bias" || l->part == "attn.masked_bias");
}

// [rows, cols] -> [cols, rows], element by element whatever the element size.
sdk::HostTensor transposed(sdk::HostTensor t, const std::string& origin,
                           const std::string& file_name) {
  if (t.shape.size() != 2)
    throw sdk::CheckpointError(origin + ": tensor '" + file_name + "' has shape " +
                                   ops::shape_text(t.shape) + ", but a GPT-2 linear weight is 2-D",
                               "the file is not a GPT-2 model's weights");
  const auto rows = static_cast<std::size_t>(t.shape[0]);
  const auto cols = static_cast<std::size_t>(t.shape[1]);
  const std::size_t size = rows * cols == 0 ? 0 : t.bytes.size() / (rows * cols);
  std::vector<std::byte> out(t.bytes.size());
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c)
      std::memcpy(out.data() + (c * rows + r) * size, t.bytes.data() + (r * cols + c) * size, size);
  t.bytes = std::move(out);
  t.shape = {t.shape[1], t.shape[0]};
  return t;
}

[[noreturn]] void not_gpt2(const std::string& origin, const std::string& what) {
  throw sdk::CheckpointError(
      origin + ": not the weights of a GPT-2 model ([model] preset = \"gpt\"): " + what,
      "the gpt2 layout holds gpt-preset models only; write this one in the native layout");
}

}  // namespace

std::string_view weight_layout_name(WeightLayout layout) {
  return layout == WeightLayout::gpt2 ? "gpt2" : "native";
}

WeightLayout parse_weight_layout(std::string_view name) {
  if (name == "native") return WeightLayout::native;
  if (name == "gpt2") return WeightLayout::gpt2;
  throw std::invalid_argument("unknown weight layout '" + std::string(name) + "'");
}

bool is_conv1d_weight(std::string_view name) {
  const auto l = layer_name(name);
  return l && one_of(l->part, kConv1d);
}

std::vector<sdk::HostTensor> to_gpt2_layout(std::vector<sdk::HostTensor> tensors,
                                            const std::string& origin) {
  std::set<std::string> names;
  std::int64_t layers = 0;
  for (const auto& t : tensors) {
    if (!names.insert(t.name).second) not_gpt2(origin, "two tensors are named '" + t.name + "'");
    if (const auto l = layer_name(t.name)) layers = std::max(layers, l->index + 1);
  }
  auto require = [&](const std::string& name) {
    if (!names.count(name)) not_gpt2(origin, "it has no tensor '" + name + "'");
  };
  for (const char* name : {"wte.weight", "wpe.weight", "h.0.ln_1.weight"}) require(name);
  for (std::int64_t i = 0; i < layers; ++i)
    for (auto part : kLayerWeights) require("h." + std::to_string(i) + "." + std::string(part));
  require("ln_f.weight");
  for (const auto& name : names)
    if (!is_gpt2_weight(name)) not_gpt2(origin, "GPT-2 has no tensor '" + name + "'");

  // The linears must be [out, in]: a file of GPT-2's own Conv1D weights ([in, out]) without the
  // metadata that says so would be transposed a second time, silently for the square ones.
  std::int64_t width = 0;
  for (const auto& t : tensors)
    if (t.name == "wte.weight" && t.shape.size() == 2) width = t.shape[1];
  for (const auto& t : tensors) {
    const auto l = layer_name(t.name);
    if (!l || !one_of(l->part, kConv1d) || t.shape.size() != 2) continue;
    const bool native = l->part == "attn.c_attn.weight"
                            ? t.shape == std::vector<std::int64_t>{3 * width, width}
                        : l->part == "mlp.c_proj.weight" ? t.shape[0] == width
                                                         : t.shape[1] == width;
    if (!native)
      throw sdk::CheckpointError(
          origin + ": '" + t.name + "' is " + ops::shape_text(t.shape) +
              ", not a linear's [out, in] for n_embd " + std::to_string(width) +
              (l->part == "attn.c_attn.weight" &&
                       t.shape == std::vector<std::int64_t>{width, 3 * width}
                   ? ": the file holds GPT-2's Conv1D [in, out] weights already, without the "
                     "metadata that says so (layout = \"gpt2\")"
                   : std::string()),
          "export a mixtrain checkpoint; to convert a GPT-2 state dict, start a config from it "
          "(checkpoint.init_from = the file, checkpoint.init_layout = \"gpt2\") and export that "
          "with --initial");
  }
  for (auto& t : tensors)
    if (is_conv1d_weight(t.name)) {
      const std::string name = t.name;
      t = transposed(std::move(t), origin, name);
    }
  return tensors;
}

Gpt2Import from_gpt2_layout(std::vector<sdk::HostTensor> tensors, const std::string& origin) {
  auto fail = [&](const std::string& what, const std::string& hint) {
    throw sdk::CheckpointError(origin + " (read in the gpt2 layout): " + what, hint);
  };
  Gpt2Import out;
  std::map<std::string, std::string> file_name_of;  // mixtrain name -> name in the file
  std::optional<sdk::HostTensor> head;
  for (auto& t : tensors) {
    const std::string file_name = t.name;
    std::string_view name = file_name;
    if (name.substr(0, kPrefix.size()) == kPrefix) name.remove_prefix(kPrefix.size());
    if (is_mask_buffer(name)) {
      out.dropped.push_back(file_name);
      continue;
    }
    if (name == "lm_head.weight") {
      if (head) fail("two tensors for lm_head.weight", "the file is damaged");
      head = std::move(t);
      continue;
    }
    if (!is_gpt2_weight(name))
      fail("tensor '" + file_name + "' is not a weight of Hugging Face GPT-2",
           file_name.starts_with(kPeftTensorPrefix)
               ? "the file is a PEFT adapter's: " +
                     peft_adapter_route(std::filesystem::path(origin).parent_path().string())
               : "the gpt2 layout reads GPT2Model / GPT2LMHeadModel state dicts (wte, wpe, "
                 "h.<i>.*, ln_f); for other files use the native layout "
                 "(checkpoint.init_layout = \"native\"; --layout native for eval, predict and "
                 "sample)");
    auto [it, added] = file_name_of.emplace(std::string(name), file_name);
    if (!added)
      fail("tensors '" + it->second + "' and '" + file_name + "' are both " + it->first,
           "keep one of them in the file");
    t.name = std::string(name);
    if (is_conv1d_weight(t.name)) t = transposed(std::move(t), origin, file_name);
    out.file_names.push_back(file_name);
    out.tensors.push_back(std::move(t));
  }
  if (head) {
    const sdk::HostTensor* wte = nullptr;
    for (const auto& t : out.tensors)
      if (t.name == "wte.weight") wte = &t;
    const std::string untied =
        "this model's output layer is tied to wte.weight and cannot hold "
        "an untied head; start from a GPT-2 checkpoint with a tied head";
    if (wte == nullptr)
      fail("it has lm_head.weight but no wte.weight to compare it with (the head is tied to it)",
           untied);
    if (head->shape != wte->shape || head->dtype != wte->dtype || head->bytes != wte->bytes)
      fail("lm_head.weight " + ops::shape_text(head->shape) + " differs from wte.weight " +
               ops::shape_text(wte->shape) + ": the file's head is untied",
           untied);
    out.dropped.push_back(head->name);
  }
  return out;
}

Gpt2Sizes gpt2_sizes(const std::vector<sdk::HostTensor>& tensors) {
  Gpt2Sizes s;
  for (const auto& t : tensors) {
    if (t.name == "wte.weight" && t.shape.size() == 2) {
      s.vocab_size = t.shape[0];
      s.n_embd = t.shape[1];
    } else if (t.name == "wpe.weight" && t.shape.size() == 2) {
      s.n_positions = t.shape[0];
    } else if (const auto l = layer_name(t.name)) {
      s.n_layer = std::max(s.n_layer, l->index + 1);
    }
  }
  return s;
}

}  // namespace mixtrain::core
