// LoRA adapters as a rewrite of the model's nodes; see graph/lora.h for the contract.
#include "mixtrain/core/graph/lora.h"

#include <fnmatch.h>

#include <cstdio>
#include <set>

#include "mixtrain/core/graph/model_spec.h"

namespace mixtrain::core {

namespace {

bool matches(const ParameterPattern& p, const std::string& node) {
  return fnmatch(p.pattern.c_str(), node.c_str(), 0) == 0;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + names[i];
  return out;
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

LayerSpec adapter_node(const LayerSpec& target, const LoraSpec& lora, std::string type,
                       std::string_view suffix, std::vector<std::string> inputs,
                       std::vector<std::pair<std::string, sdk::OptionValue>> options) {
  LayerSpec l;
  l.type = std::move(type);
  l.name = target.name + std::string(suffix);
  l.where = lora.where;
  l.table = "model.lora";
  l.inputs = std::move(inputs);
  for (auto& [k, v] : options) l.options.push_back({k, std::move(v), lora.where});
  return l;
}

// The sequential form's implicit inputs written out, so nodes can be inserted.
void make_graph(ModelSpec& spec) {
  if (spec.graph) return;
  for (std::size_t i = 0; i < spec.layers.size(); ++i)
    spec.layers[i].inputs = {i == 0 ? std::string(kGraphInput) : spec.layers[i - 1].name};
  spec.graph = true;
}

}  // namespace

void apply_lora(ModelSpec& spec, const LoraSpec& lora) {
  spec.lora = lora;
  if (!lora.enabled()) return;
  std::vector<std::string> linears;
  std::set<std::string> names;
  for (const auto& l : spec.layers) {
    names.insert(l.name);
    if (l.type == "linear") linears.push_back(l.name);
  }
  std::set<std::string> targets;
  for (const auto& p : lora.targets) {
    bool any = false;
    for (const auto& n : linears)
      if (matches(p, n)) {
        targets.insert(n);
        any = true;
      }
    if (!any)
      throw sdk::ConfigError(
          p.where, p.key, "target '" + p.pattern + "' matches no linear node of the model",
          linears.empty() ? std::string("the model has no linear nodes to adapt")
                          : "targets are node names or fnmatch globs (\"h.*.attn.c_attn\"); the "
                            "linear nodes: " +
                                joined(linears));
  }
  for (const auto& t : targets)
    for (const std::string_view suffix : kLoraNodeSuffixes)
      if (names.count(t + std::string(suffix)) != 0)
        throw sdk::ConfigError(lora.where, "model.lora",
                               "the model already has a node '" + t + std::string(suffix) +
                                   "', the name an adapter of '" + t + "' takes",
                               "rename that node, or leave '" + t + "' out of model.lora.targets");
  make_graph(spec);

  std::vector<LayerSpec> out;
  out.reserve(spec.layers.size() + 4 * targets.size());
  for (auto& l : spec.layers) {
    const bool target = targets.count(l.name) != 0;
    out.push_back(l);
    if (!target) continue;
    const sdk::Options o = layer_options(l, l.table.empty() ? "model.nodes" : l.table);
    const std::int64_t features = o.get_int("out");
    std::string x = l.inputs.front();
    if (lora.dropout > 0.0) {
      out.push_back(adapter_node(l, lora, "dropout", kLoraDropout, {x}, {{"p", lora.dropout}}));
      x = out.back().name;
    }
    out.push_back(adapter_node(l, lora, "linear", kLoraA, {x},
                               {{"out", sdk::OptionValue{lora.r}}, {"bias", false}}));
    out.push_back(adapter_node(l, lora, "linear", kLoraB, {out.back().name},
                               {{"out", sdk::OptionValue{features}},
                                {"bias", false},
                                {"scale", lora.scale()},
                                {"zero_init", true}}));
    out.push_back(adapter_node(l, lora, "add", kLoraSum, {l.name, out.back().name}, {}));
  }
  // Readers of a target read its sum instead, all but the sum itself.
  for (auto& l : out)
    for (auto& in : l.inputs)
      if (targets.count(in) != 0 && l.name != in + std::string(kLoraSum)) in += kLoraSum;
  spec.layers = std::move(out);
  for (const auto& t : targets)
    for (std::string_view suffix : {kLoraA, kLoraB})
      spec.freeze.trainable.push_back({t + std::string(suffix), lora.where, "model.lora"});
}

std::vector<std::string> lora_targets(const ModelSpec& spec) {
  std::vector<std::string> out;
  if (!spec.lora.enabled()) return out;
  for (const auto& l : spec.layers)
    if (l.name.ends_with(kLoraA)) out.push_back(l.name.substr(0, l.name.size() - kLoraA.size()));
  return out;
}

bool is_lora_parameter(std::string_view name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight");
}

std::string lora_terms(const LoraSpec& lora) {
  if (!lora.enabled()) return "none";
  std::string globs;
  for (std::size_t i = 0; i < lora.targets.size(); ++i)
    globs += (i ? ", \"" : "\"") + lora.targets[i].pattern + "\"";
  return "r = " + std::to_string(lora.r) + ", alpha = " + number_text(lora.alpha) +
         ", dropout = " + number_text(lora.dropout) + ", targets = [" + globs + "]";
}

}  // namespace mixtrain::core
