#include "config/reading.h"

#include <algorithm>

namespace mixtrain::core {

namespace fs = std::filesystem;

std::string string_key(const std::vector<sdk::RawOption>& raw, const std::string& key,
                       const std::string& def, const std::string& table) {
  for (const auto& r : raw)
    if (r.key == key) {
      if (auto* s = std::get_if<std::string>(&r.value)) return *s;
      throw sdk::ConfigError(r.where, table + "." + key, "expected a string");
    }
  return def;
}

sdk::SourceLocation key_location(const std::vector<sdk::RawOption>& raw, const std::string& key,
                                 const sdk::SourceLocation& fallback) {
  for (const auto& r : raw)
    if (r.key == key) return r.where;
  return fallback;
}

ResolvedSection section_of(const std::string& name,
                           const std::vector<std::pair<std::string, sdk::OptionValue>>& head,
                           const sdk::Options& o1, const sdk::Options* o2) {
  ResolvedSection s;
  s.name = name;
  s.values = head;
  for (const auto& v : o1.effective()) s.values.push_back(v);
  if (o2 != nullptr)
    for (const auto& v : o2->effective()) s.values.push_back(v);
  return s;
}

// Sub-tables the host does not read would otherwise be dropped without a word.
void reject_nested(const Config& config, const std::string& table,
                   const std::vector<std::string>& allowed) {
  for (const auto& key : config.nested_keys(table)) {
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    throw sdk::ConfigError(config.location(table + "." + key), table + "." + key,
                           "unexpected sub-table",
                           "[" + table + "] takes plain key = value entries" +
                               (allowed.empty() ? std::string() : " and " + allowed.front()) +
                               "; write the value directly (no dotted keys or { } tables)");
  }
}

// The selected component's options as a resolved-config section of their own:
// [scaler] type = "dynamic" is followed by [scaler.dynamic] growth_interval = ...
void push_component(std::vector<ResolvedSection>& sections, const std::string& table,
                    const std::string& selector, const std::string& name, const sdk::Options& host,
                    const sdk::Options& component) {
  sections.push_back(section_of(table, {{selector, name}}, host));
  if (!component.effective().empty())
    sections.push_back(section_of(table + "." + name, {}, component));
}

// A path the config gives at `key`: relative to the config file's folder when written there (or
// the merged file's, for a --merge), to the current folder when given with --set (as every
// command line does). Absolute in the resolved config, so DIR/config.toml reproduces the run
// from anywhere.
fs::path config_path(const Config& config, const std::string& key, const fs::path& p) {
  if (p.is_absolute()) return p;
  return fs::absolute(config.path_base(key) / p).lexically_normal();
}

// A component's file path option, read from whichever spelling gave it ([data.npy] or flat).
fs::path resolve_path(const Config& config, const ResolvedComponentSection& r,
                      const std::string& key) {
  auto origin = r.origin.find(key);
  return config_path(config, origin == r.origin.end() ? std::string() : origin->second,
                     r.component.get_string(key));
}

// The resolved config shows `key` as the value the run uses (an absolute path, say).
void show_resolved(ResolvedSection& section, const std::string& key, const std::string& value) {
  for (auto& [k, v] : section.values)
    if (k == key) v = value;
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

bool set_away_from_default(const sdk::Options& o, const sdk::OptionSchema& schema,
                           std::string_view key) {
  if (!o.was_set(key)) return false;
  for (const auto& spec : schema)
    if (spec.name == key)
      for (const auto& [name, value] : o.effective())
        if (name == key) return value != spec.default_value;
  return true;
}

void check_unselected_table(const std::string& dotted, const sdk::OptionSchema& schema,
                            const std::vector<sdk::RawOption>& raw,
                            const sdk::SourceLocation& where) {
  auto given = [&](const std::string& key) {
    return std::any_of(raw.begin(), raw.end(),
                       [&](const sdk::RawOption& r) { return r.key == key; });
  };
  // The whole schema first: an unknown key is reported against every key the table takes.
  try {
    (void)sdk::Options::resolve(dotted, schema, raw, where, {});
    return;
  } catch (const sdk::ConfigError& e) {
    const bool missing = std::any_of(schema.begin(), schema.end(), [&](const sdk::OptionSpec& s) {
      return std::holds_alternative<std::monostate>(s.default_value) && !given(s.name) &&
             e.key() == dotted + "." + s.name;
    });
    if (!missing) throw;
  }
  // Only a required key was missing: check what the table gives, less what it does not.
  sdk::OptionSchema present;
  for (const auto& spec : schema)
    if (given(spec.name) || !std::holds_alternative<std::monostate>(spec.default_value))
      present.push_back(spec);
  (void)sdk::Options::resolve(dotted, present, raw, where, {});
}

}  // namespace mixtrain::core
