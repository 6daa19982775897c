#include "mixtrain/core/config/component_section.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "config/reading.h"

namespace mixtrain::core {

namespace {

// "[data.text]", or "[data.cifar10] or [data.text]" when several components declare the key.
std::string owner_tables(const std::string& table, const std::vector<std::string>& owners) {
  std::string out;
  for (std::size_t i = 0; i < owners.size(); ++i)
    out += (i == 0                   ? ""
            : i + 1 == owners.size() ? " or "
                                     : ", ") +
           ("[" + table + "." + owners[i] + "]");
  return out;
}

bool declares(const sdk::OptionSchema& schema, const std::string& key) {
  return std::any_of(schema.begin(), schema.end(),
                     [&](const sdk::OptionSpec& s) { return s.name == key; });
}

std::string joined(const std::vector<std::string>& names, const std::string& last = ", ") {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? last : ", ") + names[i];
  return out;
}

std::vector<std::string> names_of(const std::vector<ComponentSchema>& components) {
  std::vector<std::string> out;
  for (const auto& c : components) out.push_back(c.name);
  return out;
}

// A component table holds plain key = value entries only.
void reject_sub_tables(const Config& config, const std::string& dotted) {
  for (const auto& key : config.nested_keys(dotted))
    throw sdk::ConfigError(config.location(dotted + "." + key), dotted + "." + key,
                           "unexpected sub-table",
                           "[" + dotted + "] takes plain key = value entries");
}

// A table's scalar entries, and each list option given as an array (see
// ComponentSection::list_options) as one string. `skip`: keys read otherwise.
std::vector<sdk::RawOption> entries(const Config& config, const std::string& dotted,
                                    const std::vector<std::string>& list_options,
                                    const std::vector<std::string>& skip = {}) {
  std::vector<std::string> arrays;
  for (const auto& key : list_options)
    if (config.is_array(dotted + "." + key)) arrays.push_back(key);
  auto passed_over = arrays;
  passed_over.insert(passed_over.end(), skip.begin(), skip.end());
  auto raw = config.table_options(dotted, passed_over);
  for (const auto& key : arrays) {
    std::string joined;
    for (const auto& entry : config.string_array(dotted + "." + key))
      joined += (joined.empty() ? "" : "\n") + entry;
    raw.push_back({key, joined, config.location(dotted + "." + key)});
  }
  return raw;
}

std::string integer_list_text(const std::vector<std::int64_t>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i)
    out += (i == 0 ? "" : ", ") + std::to_string(values[i]);
  return out + "]";
}

}  // namespace

std::string config_section_of(sdk::ComponentKind kind) {
  switch (kind) {
    case sdk::ComponentKind::policy:
      return "precision";
    case sdk::ComponentKind::checkpoint_format:
      return "checkpoint";
    case sdk::ComponentKind::communicator:
      return "distributed";
    default:
      return std::string(sdk::component_kind_name(kind));
  }
}

std::vector<std::string> host_tables_given_as_arrays(const Config& config, const std::string& table,
                                                     const std::vector<std::string>& host_tables) {
  std::vector<std::string> out;
  for (const auto& sub : host_tables)
    if (config.is_array(table + "." + sub)) out.push_back(sub);
  return out;
}

std::string section_selector(const Config& config, const std::string& table,
                             const std::string& selector, const std::string& fallback,
                             const std::vector<std::string>& lists) {
  for (const auto& r : config.table_options(table, lists))
    if (r.key == selector) {
      if (const auto* s = std::get_if<std::string>(&r.value)) return *s;
      throw sdk::ConfigError(r.where, table + "." + selector, "expected a string",
                             "write " + selector + " = \"name\"");
    }
  return fallback;
}

namespace {

// One section being read: the selected component's schema and what the reading has gathered.
struct SectionReading {
  const Config& config;
  const ComponentSection& section;
  std::vector<ComponentSchema>::const_iterator selected;  // end(): none
  const sdk::OptionSchema& schema;                        // the selected component's
  ResolvedComponentSection& out;
  std::vector<sdk::RawOption> from_table = {};  // the selected component's own table
  std::vector<sdk::RawOption> host_raw = {};    // the host's keys
  std::vector<sdk::RawOption> flat = {};  // the selected component's keys written in the table
  // The keys of the other components' tables: validated, never read (ResolvedComponentSection::
  // unused).
  std::vector<std::pair<std::string, std::vector<sdk::RawOption>>> unselected = {};
  std::optional<sdk::SourceLocation> selector_where = {};  // absent: the selection is the default
};

// Sub-tables: one per component, each validated whether selected or not.
void read_component_tables(SectionReading& r) {
  const auto& section = r.section;
  const auto& table = section.table;
  const auto names = names_of(section.components);
  for (const auto& sub : r.config.nested_keys(table)) {
    if (std::find(section.host_tables.begin(), section.host_tables.end(), sub) !=
        section.host_tables.end())
      continue;
    const std::string dotted = table + "." + sub;
    auto it = std::find_if(section.components.begin(), section.components.end(),
                           [&](const ComponentSchema& c) { return c.name == sub; });
    if (it == section.components.end()) {
      // The nearest name among the components and the host's own sub-tables ([[precision.
      // override]] misspelt is the host's).
      std::vector<std::string> candidates = names;
      candidates.insert(candidates.end(), section.host_tables.begin(), section.host_tables.end());
      auto near = sdk::closest_match(sub, candidates);
      if (section.unknown_tables_are_warnings) {
        r.out.warnings.push_back(
            "[" + dotted + "] (" + r.config.location(dotted).to_string() + ") is not read: no " +
            section.noun + " named '" + sub + "' is loaded, and this command does not use the " +
            section.noun + " (train and check refuse the table" +
            (near.empty() ? std::string() : "; did you mean [" + table + "." + near + "]?") + ")");
        continue;
      }
      throw sdk::ConfigError(
          r.config.location(dotted), dotted, "no " + section.noun + " named '" + sub + "'",
          (near.empty() ? "" : "did you mean [" + table + "." + near + "]? ") + "a sub-table of [" +
              table + "] holds the options of the " + section.noun + " it is named after; " +
              "known here: " + joined(names));
    }
    reject_sub_tables(r.config, dotted);
    auto raw = entries(r.config, dotted, it->list_options);
    // Validated against its own schema even when another component is selected: unknown keys,
    // types and ranges. Required keys are checked once, on the selected component's flat keys
    // and table combined, so a table may hold part of them and an unselected sibling may be
    // filled in only partly.
    check_unselected_table(dotted, it->options, raw, r.config.location(dotted));
    if (sub == section.selected) {
      for (const auto& o : raw) r.out.origin[o.key] = dotted + "." + o.key;
      r.from_table = std::move(raw);
    } else {
      r.unselected.emplace_back(dotted, std::move(raw));
    }
  }
}

// What selects the component: `data.source = "text" at file:line:col`, or the default's words.
std::string selection_text(const SectionReading& r) {
  const auto& s = r.section;
  const std::string selector = s.table + "." + s.selector;
  if (r.selector_where)
    return selector + " = \"" + s.selected + "\" at " + r.selector_where->to_string();
  return selector + " is not given, so \"" + s.selected + "\" (the default) is selected";
}

// What an unselected component's table leaves unread, and the selector that leaves it so: the
// key and where it was written, or, for a table of several keys (one kept for a swap, as a
// shipped config's [data.synthetic] beside --set data.source=...), the table once with its keys.
void note_unselected_keys(SectionReading& r) {
  const auto& s = r.section;
  for (const auto& [dotted, raw] : r.unselected) {
    if (raw.empty()) continue;
    const std::string component = dotted.substr(s.table.size() + 1);
    const std::string why = " is not read: " + selection_text(r) + "; [" + dotted +
                            "] is read only under " + s.table + "." + s.selector + " = \"" +
                            component + "\"";
    if (raw.size() == 1) {
      r.out.unused.push_back(dotted + "." + raw.front().key + " (" + raw.front().where.to_string() +
                             ")" + why);
      continue;
    }
    std::string keys;
    for (const auto& o : raw) keys += (keys.empty() ? "" : ", ") + o.key;
    r.out.unused.push_back("[" + dotted + "] (" + std::to_string(raw.size()) + " keys: " + keys +
                           "; from " + raw.front().where.to_string() + ")" + why);
  }
}

// Flat keys read as lists: those the selected component takes as one, and those only a sibling
// declares (so the error can name the sibling's table).
std::vector<std::string> flat_list_keys(const SectionReading& r) {
  std::vector<std::string> out;
  for (const auto& c : r.section.components)
    for (const auto& key : c.list_options) {
      const bool own = r.selected != r.section.components.end() && c.name == r.selected->name;
      if (own || !declares(r.schema, key)) out.push_back(key);
    }
  return out;
}

// The host's integer lists given as arrays, as text for its string entries; their keys come back.
std::vector<std::string> read_host_lists(SectionReading& r) {
  std::vector<std::string> arrays;
  for (const auto& key : r.section.host_lists) {
    const std::string dotted = r.section.table + "." + key;
    if (!r.config.is_array(dotted)) continue;
    r.host_raw.push_back(
        {key, integer_list_text(r.config.integer_array(dotted)), r.config.location(dotted)});
    arrays.push_back(key);
  }
  return arrays;
}

// A flat key that neither the host nor the selected component declares. One that another component
// declares is refused with the selector first: moving it into that component's table alone would
// leave it unread (note_unselected_keys), while selecting the component makes the flat key apply.
[[noreturn]] void refuse_flat_key(const SectionReading& r, const sdk::RawOption& o) {
  const auto& section = r.section;
  const auto& table = section.table;
  const std::string key = table + "." + o.key;
  std::vector<std::string> owners;
  for (const auto& c : section.components)
    if (c.name != section.selected && declares(c.options, o.key)) owners.push_back(c.name);
  if (!owners.empty()) {
    std::vector<std::string> quoted;
    for (const auto& owner : owners) quoted.push_back("\"" + owner + "\"");
    const std::string selector = table + "." + section.selector;
    throw sdk::ConfigError(
        o.where, key,
        "'" + o.key + "' is an option of " + joined(owners, " and ") + ", not of the selected " +
            section.noun + " '" + section.selected + "' (" + selection_text(r) + ")",
        "to use it, select the " + section.noun + " that reads it: " + selector + " = " +
            joined(quoted, " or ") + " (`--set " + selector + "=" + owners.front() +
            "`); to keep it for later, move it into " + owner_tables(table, owners) +
            ", which is read only when that " + section.noun + " is selected");
  }
  std::vector<std::string> own = {section.selector};
  for (const auto& s : section.host) own.push_back(s.name);
  for (const auto& s : r.schema) own.push_back(s.name);
  auto near = sdk::closest_match(o.key, own);
  throw sdk::ConfigError(o.where, key, "unknown key",
                         (near.empty() ? "" : "did you mean '" + near + "'? ") + "[" + table +
                             "] takes: " + joined(own));
}

// A flat key of the selected component. The same key in its own table too: a --set beats a
// --merge, which beats the file, whichever spelling each used (calibrate writes the table's
// spelling over a config that may use the flat one); two in one layer are ambiguous.
void take_flat_option(SectionReading& r, sdk::RawOption&& o) {
  const auto& table = r.section.table;
  const std::string key = table + "." + o.key;
  auto twin = std::find_if(r.from_table.begin(), r.from_table.end(),
                           [&](const sdk::RawOption& t) { return t.key == o.key; });
  if (twin != r.from_table.end()) {
    const auto twin_key = table + "." + r.section.selected + "." + o.key;
    const auto flat_layer = r.config.layer(key), twin_layer = r.config.layer(twin_key);
    const bool twin_set = twin_layer > flat_layer;
    if (flat_layer == twin_layer)
      throw sdk::ConfigError(o.where, key,
                             "given twice: here and in [" + table + "." + r.section.selected +
                                 "] at " + twin->where.to_string(),
                             "keep one of them");
    if (twin_set) return;
    r.from_table.erase(twin);
  }
  r.out.origin[o.key] = key;
  r.flat.push_back(std::move(o));
}

// Flat keys: the selector, the host's keys, or options of the selected component.
void read_flat_keys(SectionReading& r) {
  const auto& section = r.section;
  const auto host_arrays = read_host_lists(r);
  auto read_elsewhere = host_arrays;
  for (auto& sub : host_tables_given_as_arrays(r.config, section.table, section.host_tables))
    read_elsewhere.push_back(std::move(sub));
  auto flat = entries(r.config, section.table, flat_list_keys(r), read_elsewhere);
  // The selector's location, and keys no component declares (a misspelt selector, `sourc`),
  // first: a sibling's key refused against a mistaken default selection would blame its line.
  for (const auto& o : flat) {
    if (o.key == section.selector) r.selector_where = o.where;
    const bool any_component =
        std::any_of(section.components.begin(), section.components.end(),
                    [&](const ComponentSchema& c) { return declares(c.options, o.key); });
    if (o.key != section.selector && !declares(section.host, o.key) && !any_component &&
        std::find(section.host_lists.begin(), section.host_lists.end(), o.key) ==
            section.host_lists.end())
      refuse_flat_key(r, o);
  }
  for (auto& o : flat) {
    if (std::find(section.host_lists.begin(), section.host_lists.end(), o.key) !=
        section.host_lists.end())
      throw sdk::ConfigError(o.where, section.table + "." + o.key, "expected a list of integers",
                             "write it as " + o.key + " = [100, 200] (one entry: [100])");
    if (o.key == section.selector) continue;
    if (declares(section.host, o.key))
      r.host_raw.push_back(std::move(o));
    else if (declares(r.schema, o.key))
      take_flat_option(r, std::move(o));
    else
      refuse_flat_key(r, o);
  }
}

}  // namespace

ResolvedComponentSection resolve_component_section(const Config& config,
                                                   const ComponentSection& section) {
  ResolvedComponentSection out;
  const auto& table = section.table;
  const auto where = config.location(table);
  const auto selected =
      std::find_if(section.components.begin(), section.components.end(),
                   [&](const ComponentSchema& c) { return c.name == section.selected; });
  // A component option named like one of the host's keys would be reachable only from its own
  // sub-table, the flat key always going to the host: a plugin's mistake, refused by name. The
  // registry ignores such a plugin component at load already; this holds for any section.
  if (selected != section.components.end())
    for (const auto& o : selected->options)
      if (o.name == section.selector || declares(section.host, o.name))
        throw sdk::PluginError(
            "the " + table + " component '" + selected->name + "' declares option '" + o.name +
                "', which [" + table + "] keeps for mixtrain itself",
            "rename it in the component's option_schema() and rebuild the plugin "
            "(docs/writing-plugins.md, \"Options: schemas and errors\")");
  const sdk::OptionSchema empty;
  SectionReading r{config, section, selected,
                   selected == section.components.end() ? empty : selected->options, out};
  read_component_tables(r);
  read_flat_keys(r);
  note_unselected_keys(r);

  out.host = sdk::Options::resolve(table, section.host, r.host_raw, where, {});
  const bool all_flat = r.from_table.empty() && !r.flat.empty();
  std::vector<sdk::RawOption> given = std::move(r.flat);
  given.insert(given.end(), r.from_table.begin(), r.from_table.end());
  const auto component_table = all_flat ? table : table + "." + section.selected;
  out.component = sdk::Options::resolve(component_table, r.schema, given,
                                        config.has_table(table + "." + section.selected)
                                            ? config.location(table + "." + section.selected)
                                            : where,
                                        {});
  return out;
}

}  // namespace mixtrain::core
