#include "config/misplaced_key.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/core/config/section_catalog.h"

namespace mixtrain::core {

std::optional<sdk::ConfigError> with_owner_hint(const sdk::ConfigError& e,
                                                const PluginRegistry& registry) {
  if (!std::string_view(e.what()).ends_with(": unknown key") ||
      e.hint().find("did you mean") != std::string::npos)
    return std::nullopt;
  // No dot: a key outside any table (above the first header), whose table is none.
  const auto dot = e.key().rfind('.');
  const std::string table = dot == std::string::npos ? "" : e.key().substr(0, dot);
  const std::string name = dot == std::string::npos ? e.key() : e.key().substr(dot + 1);
  const auto sections = config_sections(registry);
  std::vector<std::string> owners, defaults;
  for (const auto& section : sections) {
    if (section.name == table) continue;
    for (const auto& key : section.keys)
      if (key.name == name) owners.push_back(section.name);
    if (!section.selector_default.empty())
      defaults.push_back(section.name + "." + section.selector_default);
  }
  if (owners.empty()) return std::nullopt;
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
