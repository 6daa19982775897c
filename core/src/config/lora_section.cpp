// The [model.lora] table; see config/lora_section.h for the contract.
#include "config/lora_section.h"

#include <algorithm>
#include <optional>
#include <set>

#include "config/reading.h"
#include "mixtrain/core/checkpoint/peft_adapter.h"
#include "mixtrain/core/config/host_schemas.h"
#include "mixtrain/core/graph/lora.h"
#include "mixtrain/core/graph/model_spec.h"

namespace mixtrain::core {

namespace {

// A node name as an fnmatch pattern that matches it alone.
std::string literal_glob(const std::string& name) {
  std::string out;
  for (const char c : name) {
    if (c == '*' || c == '?' || c == '[' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string joined(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Whether the model's nodes are GPT2LMHeadModel's modules (PEFT names them under "transformer.").
bool gpt_modules(const Config& config, const Experiment& e) {
  if (e.from_pretrained.enabled()) return true;
  for (const auto& o : config.table_options("model", model_list_keys()))
    if (o.key == "preset" && std::holds_alternative<std::string>(o.value))
      return std::get<std::string>(o.value) == "gpt";
  return false;
}

// The nodes PEFT's target_modules adapts, of the model's nodes other than `skipped` (the LoRA
// rewrite's own, once it ran): linear ones, or an error at `at`.
std::set<std::string> peft_target_nodes(const PeftAdapterFolder& adapter, const ModelSpec& model,
                                        bool gpt, const std::set<std::string>& skipped,
                                        const sdk::SourceLocation& at) {
  const std::string file = adapter.config_file.string();
  std::set<std::string> out, linears;
  for (const auto& l : model.layers) {
    if (skipped.count(l.name)) continue;
    if (l.type == "linear") linears.insert(l.name);
    const std::string module = peft_module_name(l.name, gpt);
    if (!peft_targets(adapter.config, module)) continue;
    if (l.type != "linear")
      throw sdk::ConfigError(at, "model.lora.from_peft",
                             file + "'s target_modules = " + adapter.config.targets_text +
                                 " adapts '" + module + "', a node of type " + l.type +
                                 " here: mixtrain adapts linear nodes only",
                             "merge the adapter into its base model in PEFT (merge_and_unload) "
                             "and start from that folder ([model] from_pretrained)");
    out.insert(l.name);
  }
  if (out.empty())
    throw sdk::ConfigError(at, "model.lora.from_peft",
                           file + "'s target_modules = " + adapter.config.targets_text +
                               " adapts no module of this model",
                           "start from " + peft_base_model_text(adapter.config) +
                               "; this model's linear nodes: " + joined(linears));
  return out;
}

// The r, alpha and dropout the table leaves out, from the adapter: `sources` gets a line each.
std::vector<sdk::RawOption> options_with_adapter(std::vector<sdk::RawOption> raw,
                                                 const PeftAdapterFolder& adapter,
                                                 std::vector<std::string>& sources) {
  const std::string file = adapter.config_file.string();
  const auto& c = adapter.config;
  const std::pair<const char*, sdk::OptionValue> fields[] = {
      {"r", sdk::OptionValue{c.r}}, {"alpha", sdk::OptionValue{c.alpha}}, {"dropout", c.dropout}};
  const char* peft_names[] = {"r", "lora_alpha", "lora_dropout"};
  for (std::size_t i = 0; i < 3; ++i) {
    const char* key = fields[i].first;
    const sdk::OptionValue& value = fields[i].second;
    if (std::any_of(raw.begin(), raw.end(), [&](const auto& r) { return r.key == key; })) continue;
    raw.push_back({key, value, {file, 0, 0}});
    sources.push_back(std::string(key) + " = " + sdk::option_value_to_string(value) + " (its " +
                      peft_names[i] + ")");
  }
  return raw;
}

}  // namespace

PeftAdapterFolder open_peft_adapter_at(const PeftAdapterSource& source) {
  std::error_code ec;
  try {
    return open_peft_adapter(source.folder);
  } catch (const sdk::UserError& err) {
    throw sdk::ConfigError(
        source.where, "model.lora.from_peft", err.what(),
        std::filesystem::exists(source.folder, ec)
            ? err.hint()
            : err.hint() +
                  "; a run that started from it resumes, evaluates and samples without it from "
                  "its own config.toml, which states r, alpha and targets");
  }
}

void check_peft_agreement(const Experiment& e, const PeftAdapterFolder& adapter) {
  const auto& source = e.from_peft;
  const auto& lora = e.model.lora;
  const std::string file = adapter.config_file.string();
  const auto disagree = [&](const char* key, const char* field, const std::string& ours,
                            const std::string& theirs, const sdk::SourceLocation& where) {
    throw sdk::ConfigError(where, std::string("model.lora.") + key,
                           std::string(key) + " = " + ours + " disagrees with " + file + "'s " +
                               field + " = " + theirs,
                           std::string("from_peft's adapters are of its ") + field + ": remove " +
                               key + " from [model.lora] (or set it to " + theirs + ")");
  };
  if (lora.r != adapter.config.r)
    disagree("r", "r", std::to_string(lora.r), std::to_string(adapter.config.r), source.r_where);
  if (lora.alpha != adapter.config.alpha)
    disagree("alpha", "lora_alpha", sdk::option_value_to_string(lora.alpha),
             sdk::option_value_to_string(adapter.config.alpha), source.alpha_where);
  const auto targets = lora_targets(e.model);
  std::set<std::string> skipped;
  for (const auto& t : targets)
    for (const std::string_view suffix : kLoraNodeSuffixes) skipped.insert(t + std::string(suffix));
  const auto nodes = peft_target_nodes(adapter, e.model, source.gpt_modules, skipped, source.where);
  const std::set<std::string> chosen(targets.begin(), targets.end());
  if (chosen != nodes)
    throw sdk::ConfigError(source.targets_where, "model.lora.targets",
                           "targets select " + joined(chosen) + ", but " + file +
                               "'s target_modules = " + adapter.config.targets_text + " adapts " +
                               joined(nodes),
                           "remove targets from [model.lora]: from_peft's adapters sit where its "
                           "target_modules puts them");
}

void read_lora(const Config& config, Experiment& e) {
  if (!config.has_table("model.lora")) return;
  reject_nested(config, "model.lora");
  const std::vector<std::string> lists = {"targets"};
  const sdk::SourceLocation table = config.location("model.lora");
  auto raw = config.table_options("model.lora", lists);
  const std::string key = "model.lora.targets";
  const auto globs = config.string_array(key);
  const bool array = config.is_array(key);

  // from_peft: its adapter_config.json gives what the table leaves out. A table that states r,
  // alpha and targets (a run's config.toml) needs nothing of the folder here: a new run's start
  // checks them against it (train/peft_import.h), and a resume or a checkpoint's session never
  // opens it.
  std::optional<PeftAdapterFolder> adapter;
  std::vector<std::string> sources;
  const auto peft_key = std::find_if(raw.begin(), raw.end(),
                                     [](const sdk::RawOption& r) { return r.key == "from_peft"; });
  const auto* peft_text =
      peft_key == raw.end() ? nullptr : std::get_if<std::string>(&peft_key->value);
  if (peft_text != nullptr && !peft_text->empty()) {
    const auto folder = config_path(config, "model.lora.from_peft", *peft_text);
    e.from_peft.folder = folder;
    e.from_peft.where = peft_key->where;
    e.from_peft.gpt_modules = gpt_modules(config, e);
    const auto stated = [&](const char* k) {
      return std::any_of(raw.begin(), raw.end(), [&](const auto& r) { return r.key == k; });
    };
    if (!(stated("r") && stated("alpha") && !globs.empty())) {
      adapter = open_peft_adapter_at(e.from_peft);
      raw = options_with_adapter(std::move(raw), *adapter, sources);
    }
  }

  const auto o = sdk::Options::resolve("model.lora", lora_schema(), raw, table, {});
  LoraSpec lora;
  lora.r = o.get_int("r");
  lora.alpha = o.get_double("alpha");
  lora.dropout = o.get_double("dropout");
  lora.where = table;
  if (lora.dropout >= 1.0)
    o.fail("dropout", "= 1 would zero the adapters' every input",
           "use a dropout in [0, 1) (PEFT's lora_dropout; 0 for none)");
  ResolvedSection section = section_of("model.lora", {}, o);
  for (std::size_t i = 0; i < globs.size(); ++i) {
    const auto where =
        array ? config.location(key + "." + std::to_string(i)) : config.location(key);
    if (globs[i].empty())
      throw sdk::ConfigError(where, key, "an empty target names no node",
                             "write a linear node's name (\"h.0.attn.c_attn\") or a glob "
                             "(\"h.*.attn.c_attn\")");
    lora.targets.push_back({globs[i], where, array ? key + "[" + std::to_string(i) + "]" : key});
  }
  if (e.from_peft.enabled()) {
    e.from_peft.r_where = o.where("r");
    e.from_peft.alpha_where = o.where("alpha");
    e.from_peft.targets_where = globs.empty() ? e.from_peft.where : config.location(key);
  }
  if (adapter && lora.targets.empty()) {
    const auto nodes =
        peft_target_nodes(*adapter, e.model, e.from_peft.gpt_modules, {}, e.from_peft.where);
    for (const auto& n : nodes)
      lora.targets.push_back({literal_glob(n), e.from_peft.where, "model.lora.from_peft"});
    sources.push_back("targets: the " + std::to_string(nodes.size()) +
                      " linear nodes its target_modules = " + adapter->config.targets_text +
                      " adapts");
  }
  if (lora.targets.empty())
    throw sdk::ConfigError(array ? config.location(key) : table, key,
                           "LoRA needs the linear nodes to adapt",
                           "name them: targets = [\"h.*.attn.c_attn\"] (globs over node names; "
                           "`mixtrain check` lists the nodes)");
  std::string text = "[";
  for (std::size_t i = 0; i < lora.targets.size(); ++i)
    text += (i ? ", " : "") + sdk::option_value_to_string(lora.targets[i].pattern);
  std::erase_if(section.values, [](const auto& kv) { return kv.first == "targets"; });
  section.raw_values.emplace_back("targets", text + "]");
  if (e.from_peft.enabled()) {
    show_resolved(section, "from_peft", e.from_peft.folder.string());
    if (!sources.empty()) {
      section.comments.push_back("from " + (e.from_peft.folder / kPeftConfigFile).string() + ":");
      for (const auto& s : sources) section.comments.push_back("  " + s);
    }
    if (e.checkpoint.init_from.empty())
      e.config_warnings.push_back(
          "model.lora.from_peft (" + e.from_peft.where.to_string() + ") starts the adapters from " +
          e.from_peft.folder.string() +
          ", but the base model starts from its seeded initialisation: an adapter is trained "
          "on its base model's weights; name them ([model] from_pretrained or "
          "checkpoint.init_from)");
  }
  apply_lora(e.model, lora);
  if (adapter) check_peft_agreement(e, *adapter);
  e.core_sections.push_back(section);
}

}  // namespace mixtrain::core
