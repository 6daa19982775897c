#include "model_presets.h"

#include <cmath>
#include <string>

namespace mixtrain::core {

namespace {

class NodeList {
 public:
  explicit NodeList(const GptPreset& p) : where_(p.where) {}
  void add(std::string type, std::string name, std::vector<std::string> inputs,
           std::vector<std::pair<std::string, sdk::OptionValue>> options = {}) {
    LayerSpec l;
    l.type = std::move(type);
    l.name = std::move(name);
    l.where = where_;
    l.table = "model.gpt";
    l.inputs = std::move(inputs);
    for (auto& [k, v] : options) l.options.push_back({k, std::move(v), where_});
    nodes_.push_back(std::move(l));
  }
  std::vector<LayerSpec> take() { return std::move(nodes_); }

 private:
  sdk::SourceLocation where_;
  std::vector<LayerSpec> nodes_;
};

}  // namespace

std::vector<LayerSpec> gpt_preset(const GptPreset& p) {
  using V = sdk::OptionValue;
  const double std_init = 0.02;
  const double std_residual = 0.02 / std::sqrt(2.0 * static_cast<double>(p.n_layer));
  const std::int64_t c = p.n_embd;
  NodeList nodes(p);
  nodes.add("embedding", "wte", {"input"},
            {{"vocab", V{p.vocab_size}}, {"dim", V{c}}, {"init_std", V{std_init}}});
  nodes.add("position_embedding", "wpe", {"wte"},
            {{"positions", V{p.block_size}}, {"init_std", V{std_init}}});
  std::string stream = "wpe";
  for (std::int64_t i = 0; i < p.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    auto linear = [&](const std::string& name, const std::string& in, std::int64_t out,
                      double init) {
      nodes.add("linear", h + name, {in},
                {{"out", V{out}}, {"bias", V{p.bias}}, {"init_std", V{init}}});
    };
    nodes.add("layernorm", h + "ln_1", {stream});
    linear("attn.c_attn", h + "ln_1", 3 * c, std_init);
    nodes.add("attention", h + "attn", {h + "attn.c_attn"}, {{"heads", V{p.n_head}}});
    linear("attn.c_proj", h + "attn", c, std_residual);
    nodes.add("add", h + "residual_1", {stream, h + "attn.c_proj"});
    nodes.add("layernorm", h + "ln_2", {h + "residual_1"});
    linear("mlp.c_fc", h + "ln_2", 4 * c, std_init);
    nodes.add("gelu", h + "mlp.gelu", {h + "mlp.c_fc"});
    linear("mlp.c_proj", h + "mlp.gelu", c, std_residual);
    nodes.add("add", h + "residual_2", {h + "residual_1", h + "mlp.c_proj"});
    stream = h + "residual_2";
  }
  nodes.add("layernorm", "ln_f", {stream});
  nodes.add(
      "linear", "lm_head", {"ln_f"},
      {{"out", V{p.vocab_size}}, {"bias", V{false}}, {"tie_weight", V{std::string("wte.weight")}}});
  return nodes.take();
}

}  // namespace mixtrain::core
