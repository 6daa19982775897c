#include "config/model_presets.h"

#include <cmath>
#include <string>

namespace mixtrain::core {

namespace {

class NodeList {
 public:
  NodeList(sdk::SourceLocation where, std::string table)
      : where_(std::move(where)), table_(std::move(table)) {}
  void add(std::string type, std::string name, std::vector<std::string> inputs,
           std::vector<std::pair<std::string, sdk::OptionValue>> options = {}) {
    LayerSpec l;
    l.type = std::move(type);
    l.name = std::move(name);
    l.where = where_;
    l.table = table_;
    l.inputs = std::move(inputs);
    for (auto& [k, v] : options) l.options.push_back({k, std::move(v), where_});
    nodes_.push_back(std::move(l));
  }
  // The last node's `option` is made from the preset's `key` (LayerSpec::preset_keys).
  void made_from(const std::string& option, std::string key,
                 const std::map<std::string, sdk::SourceLocation>& key_where = {}) {
    auto& node = nodes_.back();
    if (const auto at = key_where.find(key.substr(key.rfind('.') + 1)); at != key_where.end())
      for (auto& o : node.options)
        if (o.key == option) o.where = at->second;
    node.preset_keys[option] = std::move(key);
  }
  std::vector<LayerSpec> take() { return std::move(nodes_); }

 private:
  sdk::SourceLocation where_;
  std::string table_;
  std::vector<LayerSpec> nodes_;
};

}  // namespace

std::vector<LayerSpec> gpt_preset(const GptPreset& p) {
  using V = sdk::OptionValue;
  const double std_init = 0.02;
  const double std_residual = 0.02 / std::sqrt(2.0 * static_cast<double>(p.n_layer));
  const std::int64_t c = p.n_embd;
  NodeList nodes(p.where, "model.gpt");
  nodes.add("embedding", "wte", {"input"},
            {{"vocab", V{p.vocab_size}}, {"dim", V{c}}, {"init_std", V{std_init}}});
  nodes.made_from("vocab", "model.gpt.vocab_size", p.key_where);
  nodes.made_from("dim", "model.gpt.n_embd", p.key_where);
  nodes.add("position_embedding", "wpe", {"wte"},
            {{"positions", V{p.block_size}}, {"init_std", V{std_init}}});
  nodes.made_from("positions", "model.gpt.block_size", p.key_where);
  std::string stream = "wpe";
  for (std::int64_t i = 0; i < p.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    auto linear = [&](const std::string& name, const std::string& in, std::int64_t out,
                      double init) {
      nodes.add("linear", h + name, {in},
                {{"out", V{out}}, {"bias", V{p.bias}}, {"init_std", V{init}}});
    };
    nodes.add("layernorm", h + "ln_1", {stream}, {{"eps", V{kGptLayerNormEps}}});
    linear("attn.c_attn", h + "ln_1", 3 * c, std_init);
    std::vector<std::pair<std::string, V>> attention{{"heads", V{p.n_head}}};
    if (!p.fused_attention) attention.push_back({"fused", V{false}});
    nodes.add("attention", h + "attn", {h + "attn.c_attn"}, std::move(attention));
    linear("attn.c_proj", h + "attn", c, std_residual);
    nodes.add("add", h + "residual_1", {stream, h + "attn.c_proj"});
    nodes.add("layernorm", h + "ln_2", {h + "residual_1"}, {{"eps", V{kGptLayerNormEps}}});
    linear("mlp.c_fc", h + "ln_2", 4 * c, std_init);
    nodes.add("gelu", h + "mlp.gelu", {h + "mlp.c_fc"});
    linear("mlp.c_proj", h + "mlp.gelu", c, std_residual);
    nodes.add("add", h + "residual_2", {h + "residual_1", h + "mlp.c_proj"});
    stream = h + "residual_2";
  }
  nodes.add("layernorm", "ln_f", {stream}, {{"eps", V{kGptLayerNormEps}}});
  nodes.add(
      "linear", "lm_head", {"ln_f"},
      {{"out", V{p.vocab_size}}, {"bias", V{false}}, {"tie_weight", V{std::string("wte.weight")}}});
  nodes.made_from("out", "model.gpt.vocab_size", p.key_where);
  return nodes.take();
}

std::vector<LayerSpec> resnet_preset(const ResNetPreset& p) {
  using V = sdk::OptionValue;
  NodeList nodes(p.where, "model.resnet");
  auto conv = [&](const std::string& name, const std::string& in, std::int64_t out,
                  std::int64_t kernel, std::int64_t stride, std::int64_t padding) {
    nodes.add("conv2d", name, {in},
              {{"out", V{out}},
               {"kernel", V{kernel}},
               {"stride", V{stride}},
               {"padding", V{padding}},
               {"bias", V{false}},
               {"init", V{std::string("kaiming_normal")}}});
  };
  const bool imagenet = p.stem == ResNetStem::imagenet;
  const std::int64_t stem_width = p.stem_width > 0 ? p.stem_width : p.widths.front();
  if (imagenet)
    conv("conv1", "input", stem_width, 7, 2, 3);
  else
    conv("conv1", "input", stem_width, 3, 1, 1);
  nodes.add("batchnorm2d", "bn1", {"conv1"});
  nodes.add("relu", "relu", {"bn1"});
  std::string x = "relu";
  if (imagenet) {
    nodes.add("maxpool2d", "maxpool", {x}, {{"kernel", V{3}}, {"stride", V{2}}, {"padding", V{1}}});
    x = "maxpool";
  }
  const bool bottleneck = p.block == ResNetBlock::bottleneck;
  // torchvision's Bottleneck widens its output 4× (expansion); a stage's `width` is its 3×3
  // convolutions' channels either way, as torchvision's `planes`.
  const std::int64_t expansion = bottleneck ? 4 : 1;
  std::int64_t channels = stem_width;
  for (std::size_t s = 0; s < p.blocks.size(); ++s) {
    const std::int64_t width = p.widths[s];
    const std::int64_t out = width * expansion;
    for (std::int64_t b = 0; b < p.blocks[s]; ++b) {
      const std::string h = "layer" + std::to_string(s + 1) + "." + std::to_string(b) + ".";
      const std::int64_t stride = s > 0 && b == 0 ? 2 : 1;
      std::string residual;
      if (bottleneck) {
        // torchvision's Bottleneck (ResNet v1.5): the stride on the 3×3 conv2, not on conv1 as
        // in the original paper, so a checkpoint computes what torchvision's resnet50 computes.
        conv(h + "conv1", x, width, 1, 1, 0);
        nodes.add("batchnorm2d", h + "bn1", {h + "conv1"});
        nodes.add("relu", h + "relu1", {h + "bn1"});
        conv(h + "conv2", h + "relu1", width, 3, stride, 1);
        nodes.add("batchnorm2d", h + "bn2", {h + "conv2"});
        nodes.add("relu", h + "relu2", {h + "bn2"});
        conv(h + "conv3", h + "relu2", out, 1, 1, 0);
        nodes.add("batchnorm2d", h + "bn3", {h + "conv3"});
        residual = h + "bn3";
      } else {
        // torchvision's BasicBlock: conv3x3(stride)-bn-relu-conv3x3-bn.
        conv(h + "conv1", x, width, 3, stride, 1);
        nodes.add("batchnorm2d", h + "bn1", {h + "conv1"});
        nodes.add("relu", h + "relu1", {h + "bn1"});
        conv(h + "conv2", h + "relu1", width, 3, 1, 1);
        nodes.add("batchnorm2d", h + "bn2", {h + "conv2"});
        residual = h + "bn2";
      }
      std::string shortcut = x;
      if (stride != 1 || channels != out) {
        conv(h + "downsample.0", x, out, 1, stride, 0);
        nodes.add("batchnorm2d", h + "downsample.1", {h + "downsample.0"});
        shortcut = h + "downsample.1";
      }
      // The join's ReLU is named after the block's last one: relu2 (basic), relu3 (bottleneck).
      const std::string relu = h + (bottleneck ? "relu3" : "relu2");
      nodes.add("add", h + "add", {residual, shortcut});
      nodes.add("relu", relu, {h + "add"});
      x = relu;
      channels = out;
    }
  }
  nodes.add("global_avgpool", "avgpool", {x});
  nodes.add("linear", "fc", {"avgpool"}, {{"out", V{p.classes}}});
  nodes.made_from("out", "model.resnet.classes");
  return nodes.take();
}

}  // namespace mixtrain::core
