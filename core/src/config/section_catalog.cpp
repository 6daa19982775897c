#include "mixtrain/core/config/section_catalog.h"

#include <algorithm>
#include <variant>

#include "graph/ops/op_registry.h"
#include "mixtrain/core/config/component_section.h"
#include "mixtrain/core/config/host_schemas.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

namespace {

using sdk::ComponentKind;

// "integer", not option_type_name()'s "an integer" (written for sentences).
std::string type_column(sdk::OptionType t) {
  std::string s(sdk::option_type_name(t));
  for (const char* article : {"a ", "an "})
    if (s.rfind(article, 0) == 0) return s.substr(std::string(article).size());
  return s;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The component sections: the table, its selector and the selector's default (the values
// parse_experiment() falls back to; section_catalog_test checks that they agree).
struct ComponentTable {
  ComponentKind kind;
  const char* selector;
  const char* fallback;
  const char* summary;
};
constexpr ComponentTable kComponentTables[] = {
    {ComponentKind::policy, "policy", "fp32",
     "the precision policy: the dtype of weights, GEMM inputs, activations and gradients per "
     "layer"},
    {ComponentKind::scaler, "type", "none",
     "the loss scaler: the factor the loss is multiplied by before backward, and skipped steps"},
    {ComponentKind::optimizer, "type", "adamw",
     "the optimizer (FP32 master weights), its learning-rate schedule and gradient clipping"},
    {ComponentKind::checkpoint_format, "format", "native",
     "checkpoints: how often, how many, the file format, and weights to start from"},
    {ComponentKind::backend, "type", "cpu", "the device backend the model runs on"},
    {ComponentKind::communicator, "type", "mpi",
     "data parallel: one process per rank (mpirun), gradients averaged in buckets during "
     "backward, optionally the optimizer state sharded (ZeRO stage 1)"},
};

// The host keys of a component section, beside its selector.
std::vector<SectionKey> host_keys_of(ComponentKind kind) {
  if (kind == ComponentKind::optimizer)
    return section_keys(schedule_schema(), {{"milestones", "integer"}});
  if (kind == ComponentKind::checkpoint_format) return section_keys(checkpoint_core_schema());
  if (kind == ComponentKind::communicator) return section_keys(distributed_schema());
  return {};
}

// A section without a selector.
ConfigSection plain(std::string name, std::string summary, std::vector<SectionKey> keys,
                    std::string origin = "host") {
  ConfigSection s;
  s.name = std::move(name);
  s.summary = std::move(summary);
  s.origin = std::move(origin);
  s.keys = std::move(keys);
  return s;
}

std::string origin_of(const LoadedComponent& c) {
  return "plugin '" + c.plugin_name + "' " + c.plugin_version + " (" + c.library.string() + ")";
}

void add_data_sections(std::vector<ConfigSection>& out) {
  auto data = plain("data", "the dataset: where rows come from, batch sizes, the held-out split",
                    section_keys(data_common_schema()));
  data.selector = "source";
  data.selector_default = "synthetic";
  data.choices = data_sources();
  out.push_back(data);
  for (const auto& [name, source] : kDataSources) {
    auto s = plain("data." + std::string(name), data_source_summary(source),
                   section_keys(data_source_schema(source)));
    for (auto& k : s.keys)
      if (is_path_list_option(source, k.name)) k.type = "string or string list";
    out.push_back(std::move(s));
  }
  out.push_back(
      plain("data.normalize",
            "per-channel image normalisation (images only): fixed statistics or the "
            "training split's",
            section_keys(data_normalize_schema(), {{"mean", "number"}, {"std", "number"}})));
  out.push_back(plain("data.augment",
                      "training-time image augmentation (images only): random crops and flips",
                      section_keys(data_augment_schema())));
}

void add_model_sections(std::vector<ConfigSection>& out) {
  auto model = plain("model", "the network: a preset, or layers/nodes/blocks of the op table",
                     section_keys(model_schema(), {{"recompute", "string"}}));
  model.keys.push_back({"layers", "table list", "[]", "",
                        "a chain of layers, each an inline table { type = \"linear\", ... } "
                        "(mixtrain describe layer.TYPE)"});
  model.keys.push_back(
      {"nodes", "table list", "[]", "",
       "a graph of named nodes, each with inputs = [\"...\"] (docs/model-graph.md)"});
  // A table of tables, not a list: [model.blocks.NAME], one sub-table per block.
  model.keys.push_back({"blocks", "table of tables", "{}", "",
                        "named sub-graphs, one [model.blocks.NAME] per block (inputs, nodes, "
                        "output), used by nodes as block = \"NAME\" (docs/model-graph.md)"});
  out.push_back(std::move(model));
  out.push_back(plain("model.gpt", "a GPT-2 style decoder (preset = \"gpt\")",
                      section_keys(gpt_preset_schema())));
  auto resnet = plain("model.resnet", "a torchvision-style ResNet (preset = \"resnet\")",
                      section_keys(resnet_preset_schema()));
  resnet.keys.insert(resnet.keys.begin(),
                     {{"blocks", "integer list", "(required)", "",
                       "blocks per stage: [2, 2, 2, 2] is ResNet-18, [3, 4, 6, 3] ResNet-34/50, "
                       "[3, 3, 3] ResNet-20"},
                      {"widths", "integer list", "(required)", "",
                       "channels per stage (a bottleneck's output is 4x): [64, 128, 256, 512]"}});
  out.push_back(std::move(resnet));
  out.push_back(plain("model.lora",
                      "LoRA adapters beside linear nodes, as PEFT's; the rest of the model is "
                      "frozen",
                      section_keys(lora_schema(), {{"targets", "string"}})));
}

}  // namespace

const std::vector<std::string>& config_top_level_tables() {
  static const std::vector<std::string> tables = {
      "run",     "data", "model", "precision", "scaler",  "optimizer",  "checkpoint",
      "backend", "ema",  "eval",  "train",     "plugins", "distributed"};
  return tables;
}

std::vector<SectionKey> section_keys(const sdk::OptionSchema& schema,
                                     const std::vector<ListKey>& lists) {
  std::vector<SectionKey> rows;
  for (const auto& o : schema) {
    const bool required = std::holds_alternative<std::monostate>(o.default_value);
    const auto list = std::find_if(lists.begin(), lists.end(),
                                   [&](const ListKey& l) { return l.name == o.name; });
    if (list == lists.end()) {
      rows.push_back({o.name, type_column(o.type),
                      required ? "(required)" : sdk::option_value_to_string(o.default_value),
                      o.range_text(), o.doc});
      continue;
    }
    // The schema's default is the list's one entry, or "" for an empty list; its range is each
    // entry's.
    const auto* entry = std::get_if<std::string>(&o.default_value);
    std::string def = "[]";
    if (entry != nullptr && !entry->empty())
      def = "[" + (list->entries == "string" ? "\"" + *entry + "\"" : *entry) + "]";
    rows.push_back({o.name, list->entries + " list", required ? "(required)" : def,
                    o.range_text().empty() ? "" : "each " + o.range_text(), o.doc});
  }
  return rows;
}

std::vector<std::string> host_owned_keys(ComponentKind kind) {
  std::vector<std::string> out;
  for (const auto& t : kComponentTables)
    if (t.kind == kind) out.push_back(t.selector);
  for (const auto& k : host_keys_of(kind)) out.push_back(k.name);
  return out;
}

std::vector<ConfigSection> config_sections(const PluginRegistry& registry) {
  std::vector<ConfigSection> out;
  out.push_back(plain("run",
                      "the run: its name, steps, logging, evaluation cadence and stopping rules",
                      section_keys(run_schema(), {{"metrics", "string"}})));
  add_data_sections(out);
  add_model_sections(out);

  for (const auto& t : kComponentTables) {
    const std::string table = config_section_of(t.kind);
    auto s = plain(table, t.summary, host_keys_of(t.kind));
    s.selector = t.selector;
    s.selector_default = t.fallback;
    std::vector<ConfigSection> components;
    for (const auto& c : registry.components()) {
      if (c.info.kind != t.kind) continue;
      s.choices.push_back(c.info.name);
      components.push_back(plain(table + "." + c.info.name, c.info.description,
                                 section_keys(c.info.options), origin_of(c)));
    }
    out.push_back(std::move(s));
    if (t.kind == ComponentKind::policy) {
      auto o = plain("precision.override",
                     "per-layer dtypes over the policy's plan, by layer name or glob; one table "
                     "per rule",
                     section_keys(precision_override_schema()));
      o.array_of_tables = true;
      out.push_back(std::move(o));
      out.push_back(plain("precision.escalate",
                          "automatic escalation: an op blamed for non-finite steps `after` times "
                          "within `window` steps is promoted one format wider; present means on",
                          section_keys(escalate_schema())));
    }
    for (auto& c : components) out.push_back(std::move(c));
  }

  out.push_back(plain("ema", "an exponential moving average of the FP32 master weights",
                      section_keys(ema_schema())));
  out.push_back(
      plain("eval", "how evaluation runs and what it reports", section_keys(eval_schema())));
  out.push_back(
      plain("train",
            "which parameters train: trainable selects (default all), frozen removes; "
            "patterns are names or globs over \"<node>.<param>\" and node names",
            section_keys(train_schema(), {{"trainable", "string"}, {"frozen", "string"}})));
  out.push_back(plain("plugins", "where plugin libraries are searched for",
                      {{"paths", "string list", "[]", "",
                        "folders searched for plugin libraries after the installed ones and "
                        "MIXTRAIN_PLUGIN_PATH (relative to the config file); the first library "
                        "to provide a name wins"}}));
  for (const auto& type : layer_types()) {
    auto keys = section_keys(layer_schema(type));
    // Read beside the op's options as an array (model_section.cpp), so no schema holds it.
    if (const OpDefinition* op = find_op(type); op != nullptr && op->takes_shape)
      keys.push_back({"shape", "integer list", "(required)", "",
                      "the output shape per sample, without the batch: e.g. [4, 16]; one size "
                      "may be -1"});
    out.push_back(
        plain("layer." + type,
              "a layer of type \"" + type + "\": one inline table of [model] layers or nodes",
              std::move(keys)));
  }
  return out;
}

const ConfigSection& find_config_section(const std::vector<ConfigSection>& sections,
                                         const std::string& name) {
  for (const auto& s : sections)
    if (s.name == name) return s;
  std::vector<std::string> names;
  for (const auto& s : sections) names.push_back(s.name);
  const auto near = sdk::closest_match(name, names);
  throw sdk::UserError("no config section '" + name + "'",
                       (near.empty() ? "" : "did you mean '" + near + "'? ") +
                           "sections: " + join(config_top_level_tables()) +
                           ", and their sub-tables (mixtrain describe lists them all)");
}

}  // namespace mixtrain::core
