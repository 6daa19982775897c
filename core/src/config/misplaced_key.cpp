#include "config/misplaced_key.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/core/config/section_catalog.h"

namespace mixtrain::core {

namespace {

// The component `config` selects in `section` ([data] source), or "" when that cannot be told
// (a selector of the wrong type is an error of its own).
std::string selected_in(const Config& config, const ConfigSection& section) {
  try {
    const auto given = config.string_array(section.name + "." + section.selector);
    if (given.size() > 1) return {};
    return given.empty() ? section.selector_default : given.front();
  } catch (const sdk::UserError&) {
    return {};
  }
}

}  // namespace

std::optional<sdk::ConfigError> with_owner_hint(const sdk::ConfigError& e,
                                                const PluginRegistry& registry,
                                                const Config& config) {
  if (!std::string_view(e.what()).ends_with(": unknown key") ||
      e.hint().find("did you mean") != std::string::npos)
    return std::nullopt;
  // No dot: a key outside any table (above the first header), whose table is none.
  const auto dot = e.key().rfind('.');
  const std::string table = dot == std::string::npos ? "" : e.key().substr(0, dot);
  const std::string name = dot == std::string::npos ? e.key() : e.key().substr(dot + 1);
  const auto sections = config_sections(registry);
  // Owners are sections that read the key under this config; `idle` are tables of components the
  // config does not select ([data.cifar10] under source = "text"), where a key moved is not read,
  // and layer options, which no dotted key reaches: they are named with what would read them
  // (the selector, a layer entry), never as a "did you mean".
  std::vector<std::string> owners, defaults, idle;
  for (const auto& section : sections) {
    if (!section.selector_default.empty())
      defaults.push_back(section.name + "." + section.selector_default);
    if (section.name == table) continue;
    if (std::none_of(section.keys.begin(), section.keys.end(),
                     [&](const SectionKey& key) { return key.name == name; }))
      continue;
    // "layer.TYPE" is an entry of [model] layers or nodes, no table a dotted key can reach.
    if (section.name.starts_with("layer.")) {
      const std::string type = section.name.substr(std::string_view("layer.").size());
      idle.push_back("a " + type + " layer (an entry of [model] layers or nodes: { type = \"" +
                     type + "\", " + name + " = ... })");
      continue;
    }
    const auto dot_at = section.name.rfind('.');
    const ConfigSection* parent = nullptr;
    if (dot_at != std::string::npos)
      for (const auto& p : sections)
        if (p.name == section.name.substr(0, dot_at) && !p.selector.empty()) parent = &p;
    const std::string component =
        dot_at == std::string::npos ? "" : section.name.substr(dot_at + 1);
    if (parent != nullptr && std::find(parent->choices.begin(), parent->choices.end(), component) !=
                                 parent->choices.end()) {
      const std::string chosen = selected_in(config, *parent);
      if (!chosen.empty() && chosen != component) {
        idle.push_back("[" + section.name + "] (read only under " + parent->name + "." +
                       parent->selector + " = \"" + component + "\"; this config selects \"" +
                       chosen + "\")");
        continue;
      }
    }
    owners.push_back(section.name);
  }
  if (owners.empty() && idle.empty()) return std::nullopt;
  if (owners.empty()) {
    std::string hint = "'" + name + "' is an option of ";
    for (std::size_t i = 0; i < idle.size(); ++i) hint += (i == 0 ? "" : " and of ") + idle[i];
    return sdk::ConfigError(e.where(), e.key(), "unknown key", hint + "; " + e.hint());
  }
  // The default component's table first (optimizer.adamw's lr before optimizer.sgd's).
  std::stable_partition(owners.begin(), owners.end(), [&](const std::string& owner) {
    return std::find(defaults.begin(), defaults.end(), owner) != defaults.end();
  });
  std::string hint = "'" + name + "' is a key of [" + owners.front() + "]";
  if (owners.size() > 1)
    hint += " and " + std::to_string(owners.size() - 1) + " other section" +
            (owners.size() > 2 ? "s" : "") + " (`mixtrain describe` lists them)";
  hint += ": did you mean " + owners.front() + "." + name + "? " + e.hint();
  return sdk::ConfigError(e.where(), e.key(), "unknown key", hint);
}

}  // namespace mixtrain::core
