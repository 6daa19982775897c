#include "mixtrain/core/config/config.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <toml++/toml.h>

#include <nlohmann/json.hpp>
#include "config/reading.h"

namespace mixtrain::core {

namespace fs = std::filesystem;

struct Config::Impl {
  std::string source;
  fs::path base;
  toml::table root;
  std::map<std::string, sdk::SourceLocation> override_locations;
  // Keys a merged file wrote (whole tables where it brought one the config lacked), and that
  // file's folder: relative paths there resolve against it.
  std::map<std::string, fs::path> merged_bases;
  // Where each merged value (and everything inside it) was written: TOML++ does not copy a
  // node's source region when the merge copies the node.
  std::map<std::string, sdk::SourceLocation> merged_locations;
};

namespace {

// A node's own file wins: a merged file's values keep their file:line:col.
sdk::SourceLocation loc_of(const toml::node& n, const std::string& source) {
  const auto& s = n.source();
  return {s.path && !s.path->empty() ? *s.path : source, static_cast<std::uint32_t>(s.begin.line),
          static_cast<std::uint32_t>(s.begin.column)};
}

std::vector<std::string> split_dotted(std::string_view dotted) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= dotted.size()) {
    auto end = dotted.find('.', start);
    if (end == std::string_view::npos) end = dotted.size();
    out.emplace_back(dotted.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// nlohmann's dump() refuses invalid UTF-8: the check toml++ gives a file's own bytes.
bool is_utf8(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

bool is_index(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// An array index written in a dotted key; nullopt when it does not fit in size_t (such an index
// is out of range of every array, and std::stoul would throw an untyped out_of_range).
std::optional<std::size_t> parse_index(const std::string& s) {
  std::size_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

const toml::node* lookup(const toml::table& root, std::string_view dotted) {
  const toml::node* cur = &root;
  for (const auto& part : split_dotted(dotted)) {
    if (const auto* t = cur->as_table()) {
      cur = t->get(part);
    } else if (const auto* a = cur->as_array(); a != nullptr && is_index(part)) {
      const auto idx = parse_index(part);
      if (!idx) return nullptr;
      cur = a->get(*idx);
    } else {
      return nullptr;
    }
    if (cur == nullptr) return nullptr;
  }
  return cur;
}

std::optional<sdk::OptionValue> scalar_value(const toml::node& n) {
  if (auto v = n.value_exact<bool>()) return sdk::OptionValue{*v};
  if (auto v = n.value_exact<std::int64_t>()) return sdk::OptionValue{*v};
  if (auto v = n.value_exact<double>()) return sdk::OptionValue{*v};
  if (auto v = n.value_exact<std::string>()) return sdk::OptionValue{*v};
  return std::nullopt;
}

void apply_override(Config::Impl& impl, const std::string& spec) {
  const sdk::SourceLocation where{"--set " + spec, 0, 0};
  auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0)
    throw sdk::ConfigError(where, "", "an override must look like key=value",
                           "for example --set precision.policy=bf16-mixed");
  std::string key = spec.substr(0, eq);
  std::string text = spec.substr(eq + 1);
  auto parts = split_dotted(key);
  for (const auto& p : parts)
    if (p.empty())
      throw sdk::ConfigError(where, key, "empty key segment", "use dotted keys like run.steps=10");

  // The value: a TOML value if it parses as one, otherwise a plain string (so names need no
  // quoting on the command line).
  toml::table parsed;
  bool parsed_ok = false;
  std::string toml_error;
  try {
    parsed = toml::parse("v = " + text);
    parsed_ok = parsed.contains("v");
  } catch (const toml::parse_error& e) {
    parsed_ok = false;
    toml_error = std::string(e.description());
  }
  // A value that opens a list, an inline table or a quoted string was meant as TOML: kept as a
  // plain string it would reach the reader as "got a string", hiding the syntax error.
  if (!parsed_ok && !text.empty() &&
      std::string_view("[{\"'").find(text.front()) != std::string_view::npos)
    throw sdk::ConfigError(where, key, "the value is not valid TOML: " + toml_error,
                           "write a list as [1, 2], a table as {k = 1}, a string as \"text\" "
                           "(a name or glob that starts with [, { or a quote is a string: quote "
                           "it, --set 'k=\"[01]*\"'; quote the whole --set for the shell)");

  // A TOML file's bytes are checked by toml++; a command line's only here. Kept, invalid UTF-8
  // would reach the run's config.toml, which no reader (a resume included) could parse again.
  if (!parsed_ok && !is_utf8(text))
    throw sdk::ConfigError(where, key, "the value is not valid UTF-8 text",
                           "give the value in UTF-8 (a name or a path as the shell spells it)");

  toml::node* cur = &impl.root;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    const auto& part = parts[i];
    if (auto* t = cur->as_table()) {
      auto* next = t->get(part);
      if (next == nullptr) {
        t->insert(part, toml::table{});
        next = t->get(part);
      }
      cur = next;
    } else if (auto* a = cur->as_array(); a != nullptr && is_index(part)) {
      const auto idx = parse_index(part);
      if (!idx || *idx >= a->size()) {
        std::string list;  // the array's own key: parts[0, i)
        for (std::size_t j = 0; j < i; ++j) list += (j ? "." : "") + parts[j];
        throw sdk::ConfigError(where, key,
                               "index " + part + " is out of range (the array has " +
                                   std::to_string(a->size()) + " entries)",
                               a->empty() ? "give the whole list: " + list + "=[...]"
                                          : "set an entry from " + list + ".0 to " + list + "." +
                                                std::to_string(a->size() - 1) +
                                                ", or give the whole list: " + list + "=[...]");
      }
      cur = a->get(*idx);
    } else {
      // The culprit is the node reached so far (parts[0, i)), not `part`, which may not exist.
      std::string parent;
      for (std::size_t j = 0; j < i; ++j) parent += (j ? "." : "") + parts[j];
      if (cur->is_array())
        throw sdk::ConfigError(
            where, key,
            "'" + parent + "' is an array, so '" + part + "' must be an index (0, 1, ...)");
      throw sdk::ConfigError(where, key,
                             "'" + parent + "' is not a table in this config, so '" + part +
                                 "' cannot be set inside it");
    }
  }
  if (auto* a = cur->as_array(); a != nullptr && is_index(parts.back())) {
    // An entry of a list (a plain value or an inline table) is replaced whole.
    const auto idx = parse_index(parts.back());
    if (!idx || *idx >= a->size())
      throw sdk::ConfigError(where, key,
                             "index " + parts.back() + " is out of range (the array has " +
                                 std::to_string(a->size()) + " entries)",
                             "set an existing entry, or give the whole list: " +
                                 key.substr(0, key.size() - parts.back().size() - 1) + "=[...]");
    const auto at = a->cbegin() + static_cast<std::ptrdiff_t>(*idx);
    if (parsed_ok)
      a->replace(at, *parsed.get("v"));
    else
      a->replace(at, text);
  } else {
    auto* table = cur->as_table();
    if (table == nullptr && cur->is_array())
      throw sdk::ConfigError(
          where, key,
          "the parent of '" + parts.back() + "' is a list, so it must be an index (0, 1, ...)");
    if (table == nullptr)
      throw sdk::ConfigError(where, key,
                             "the parent of '" + parts.back() + "' is neither a table nor a list");
    if (parsed_ok)
      table->insert_or_assign(parts.back(), *parsed.get("v"));
    else
      table->insert_or_assign(parts.back(), text);
  }
  impl.override_locations[key] = where;
  // What the merge wrote at or under this key is gone.
  const std::string under = key + ".";
  for (auto it = impl.merged_locations.lower_bound(key); it != impl.merged_locations.end();) {
    if (it->first != key && it->first.compare(0, under.size(), under) != 0) break;
    it = impl.merged_locations.erase(it);
  }
}

// Merges `from` over `into` (docs/architecture.md, "Configs"): a table merges key by key, any
// other value (arrays of tables included) replaces the config's whole. `prefix` is the dotted
// path of `into`; every key written is recorded with `base`.
void record_locations(const toml::node& n, const std::string& key, const std::string& source,
                      std::map<std::string, sdk::SourceLocation>& out) {
  out[key] = loc_of(n, source);
  if (const auto* t = n.as_table())
    for (const auto& [k, v] : *t)
      record_locations(v, key + "." + std::string(k.str()), source, out);
  if (const auto* a = n.as_array())
    for (std::size_t i = 0; i < a->size(); ++i)
      record_locations(*a->get(i), key + "." + std::to_string(i), source, out);
}

void merge_table(Config::Impl& impl, toml::table& into, const toml::table& from,
                 const std::string& prefix, const fs::path& base, const std::string& source) {
  for (const auto& [k, v] : from) {
    const std::string key =
        prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    auto* existing = into.get(k.str());
    if (existing != nullptr && existing->is_table() && v.is_table()) {
      impl.merged_locations[key] = loc_of(v, source);
      merge_table(impl, *existing->as_table(), *v.as_table(), key, base, source);
      continue;
    }
    into.insert_or_assign(k.str(), v);
    impl.merged_bases[key] = base;
    record_locations(v, key, source, impl.merged_locations);
  }
}

// The text of a TOML file; `what` names it in errors ("the config file", "the file given to
// --merge"), `kind` says what a folder is not ("a config file"), `example` is a file that would do.
std::string read_toml_file(const fs::path& path, const std::string& what, const std::string& kind,
                           const std::string& example) {
  // A folder opens as a stream on Linux and reads as an empty document.
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw sdk::ConfigError({path.string(), 0, 0}, "", "this is a folder, not " + kind,
                           "give the path of a .toml file, e.g. " + example);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw sdk::ConfigError({path.string(), 0, 0}, "", "cannot open " + what,
                           "check the path; " + example + " is a working example");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A dotted key makes one nested table per part, and toml++ walks that tree by recursion (its
// source regions, its destructors, and so do our own walks): some tens of thousands of levels
// ([a.a.a.…], or inline tables nested on one line) overflow the stack. No config nests more than a
// few levels, so a line whose keys hold more than kMaxKeyParts parts is refused at that line
// before toml++ sees it.
constexpr std::size_t kMaxKeyParts = 1000;

// The dots that part the keys on line `l`, summed: a table header's ([a.b], up to its first
// unquoted ']'), and each key before an '=' outside quotes, at the line's start or after an
// inline table's '{' or ','. Summed, because inline tables on one line nest: the tree toml++
// recurses through is as deep as the keys along it ({a.b = {c.d = 1}} is four levels). A line
// that continues a list of dotted names or decimals ([0.5, 0.5], "fc1.weight", ...) holds no key:
// its dots never reach an '=' or end a header.
std::size_t key_dots(std::string_view l) {
  std::size_t total = 0, dots = 0;
  bool header = l.starts_with('[');  // until a ',', '{' or '[' shows it is a list
  std::size_t i = l.starts_with("[[") ? 2 : header ? 1 : 0;
  for (; i < l.size(); ++i) {
    const char c = l[i];
    if (c == '"' || c == '\'') {  // a quoted part or string: its dots are its own
      for (++i; i < l.size() && l[i] != c; ++i)
        if (c == '"' && l[i] == '\\') ++i;
    } else if (c == '.') {
      ++dots;
    } else if (c == '=' || (c == ']' && header)) {  // the segment before it was a key
      total += dots;
      dots = 0;
      header = false;
    } else if (c == '{' || c == ',' || c == '[' || c == ']' || c == '}') {
      dots = 0;  // a new segment: a value's dots (1.5) never reach an '='
      header = false;
    }
  }
  return total;
}

void refuse_absurd_key_depth(std::string_view text, const std::string& source_name) {
  std::uint32_t line = 1;
  for (std::size_t start = 0; start < text.size(); ++line) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view l = text.substr(start, end - start);
    start = end + 1;
    const auto first = l.find_first_not_of(" \t");
    if (first == std::string_view::npos || l[first] == '#') continue;
    if (const auto dots = key_dots(l.substr(first)); dots >= kMaxKeyParts)
      throw sdk::ConfigError({source_name, line, static_cast<std::uint32_t>(first + 1)}, "",
                             "keys of " + std::to_string(dots + 1) +
                                 " dotted parts on one line, more than the " +
                                 std::to_string(kMaxKeyParts) + " any config could mean",
                             "no mixtrain table nests more than a few levels: fix this line");
  }
}

toml::table parse_toml(std::string_view text, const std::string& source_name) {
  refuse_absurd_key_depth(text, source_name);
  try {
    return toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    sdk::SourceLocation where{source_name, static_cast<std::uint32_t>(e.source().begin.line),
                              static_cast<std::uint32_t>(e.source().begin.column)};
    throw sdk::ConfigError(where, "", "TOML syntax error: " + std::string(e.description()),
                           "fix the TOML syntax at that position");
  }
}

void merge_file(Config::Impl& impl, const fs::path& path) {
  const toml::table parsed = parse_toml(
      read_toml_file(path, "the file given to --merge", "a TOML file to merge",
                     "the one `mixtrain calibrate` wrote"),
      path.string());
  merge_table(impl, impl.root, parsed, "",
              path.has_parent_path() ? path.parent_path() : fs::path("."), path.string());
}

// The entry of `keys` for `dotted` or its nearest enclosing table.
template <typename Value>
const Value* enclosing_entry(const std::map<std::string, Value>& keys, std::string_view dotted) {
  std::string key(dotted);
  for (;;) {
    if (auto it = keys.find(key); it != keys.end()) return &it->second;
    const auto dot = key.rfind('.');
    if (dot == std::string::npos) return nullptr;
    key.resize(dot);
  }
}

}  // namespace

Config::Config(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Config::~Config() = default;
Config::Config(Config&&) noexcept = default;
Config& Config::operator=(Config&&) noexcept = default;

Config Config::from_file(const fs::path& path, const std::vector<std::string>& overrides,
                         const std::vector<fs::path>& merges) {
  auto cfg = from_string(
      read_toml_file(path, "the config file", "a config file", "configs/quickstart.toml"),
      path.string(), overrides, merges);
  cfg.impl_->base = path.has_parent_path() ? path.parent_path() : fs::path(".");
  return cfg;
}

Config Config::from_string(std::string_view text, const std::string& source_name,
                           const std::vector<std::string>& overrides,
                           const std::vector<fs::path>& merges) {
  auto impl = std::make_unique<Impl>();
  impl->source = source_name;
  impl->base = fs::current_path();
  impl->root = parse_toml(text, source_name);
  for (const auto& m : merges) merge_file(*impl, m);
  for (const auto& o : overrides) apply_override(*impl, o);
  return Config(std::move(impl));
}

const std::string& Config::source_name() const {
  return impl_->source;
}
fs::path Config::base_dir() const {
  return impl_->base;
}

std::vector<std::string> Config::top_level_keys() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : impl_->root) out.emplace_back(k.str());
  return out;
}

bool Config::has_table(std::string_view dotted) const {
  const auto* n = lookup(impl_->root, dotted);
  return n != nullptr && n->is_table();
}

namespace {

// The --set whose key is `dotted` or its nearest enclosing table: `--set data.npy={...}` wrote
// every key inside data.npy, and the values it copied have no source position of their own.
const sdk::SourceLocation* enclosing_override(
    const std::map<std::string, sdk::SourceLocation>& overrides, std::string_view dotted) {
  return enclosing_entry(overrides, dotted);
}

}  // namespace

sdk::SourceLocation Config::location(std::string_view dotted) const {
  const auto& overrides = impl_->override_locations;
  if (auto it = overrides.find(std::string(dotted)); it != overrides.end()) return it->second;
  if (auto it = impl_->merged_locations.find(std::string(dotted));
      it != impl_->merged_locations.end() && lookup(impl_->root, dotted) != nullptr)
    return it->second;
  if (const auto* n = lookup(impl_->root, dotted)) {
    auto l = loc_of(*n, impl_->source);
    if (l.line != 0) return l;
  }
  if (const auto* w = enclosing_override(overrides, dotted)) return *w;
  // A table that a --set created on its way (`--set scaler.dynamc.x=1` makes scaler.dynamc).
  const std::string prefix = std::string(dotted) + ".";
  if (auto it = overrides.lower_bound(prefix);
      it != overrides.end() && it->first.compare(0, prefix.size(), prefix) == 0)
    return it->second;
  return {impl_->source, 0, 0};
}

sdk::SourceLocation Config::key_location(std::string_view dotted) const {
  // A --set names its argument, and a merge's copy of a key has no source region (TOML++ does
  // not copy it): both keep location().
  if (layer(dotted) != Layer::file) return location(dotted);
  const auto dot = dotted.rfind('.');
  const toml::node* parent =
      dot == std::string_view::npos ? &impl_->root : lookup(impl_->root, dotted.substr(0, dot));
  const auto* table = parent != nullptr ? parent->as_table() : nullptr;
  if (table == nullptr) return location(dotted);
  const auto it = table->find(dot == std::string_view::npos ? dotted : dotted.substr(dot + 1));
  if (it == table->end() || it->first.source().begin.line == 0) return location(dotted);
  const auto& s = it->first.source();
  return {s.path && !s.path->empty() ? *s.path : impl_->source,
          static_cast<std::uint32_t>(s.begin.line), static_cast<std::uint32_t>(s.begin.column)};
}

bool Config::is_override(std::string_view dotted) const {
  return enclosing_override(impl_->override_locations, dotted) != nullptr;
}

Config::Layer Config::layer(std::string_view dotted) const {
  if (is_override(dotted)) return Layer::set;
  if (impl_->merged_locations.count(std::string(dotted)) != 0) return Layer::merge;
  return Layer::file;
}

fs::path Config::path_base(std::string_view dotted) const {
  if (is_override(dotted)) return fs::current_path();
  if (const auto* merged = enclosing_entry(impl_->merged_bases, dotted)) return *merged;
  return impl_->base;
}

std::vector<sdk::RawOption> Config::table_options(std::string_view dotted,
                                                  const std::vector<std::string>& skip) const {
  std::vector<sdk::RawOption> out;
  const auto* n = lookup(impl_->root, dotted);
  if (n == nullptr) return out;
  const auto* t = n->as_table();
  if (t == nullptr)
    throw sdk::ConfigError(location(dotted), std::string(dotted), "expected a table",
                           "write it as [" + std::string(dotted) + "] with key = value lines");
  for (const auto& [k, v] : *t) {
    std::string key(k.str());
    if (std::find(skip.begin(), skip.end(), key) != skip.end()) continue;
    std::string full = std::string(dotted) + "." + key;
    if (v.is_table() || v.is_array_of_tables()) continue;
    auto val = scalar_value(v);
    if (!val && v.is_array()) {
      // The lists this table takes are the keys its reader skips: a list under another name is
      // most often one of them misspelled (`milestone = [...]`).
      const std::string near = sdk::closest_match(key, skip);
      throw sdk::ConfigError(
          location(full), full,
          skip.empty() ? "a list, but [" + std::string(dotted) + "] takes no list"
                       : "a list, but no list of [" + std::string(dotted) + "] has that name",
          !near.empty()  ? "did you mean '" + near + "'?"
          : skip.empty() ? "give one boolean, integer, number or string"
                         : "the lists it takes: " + join_names(skip));
    }
    if (!val)
      throw sdk::ConfigError(location(full), full, "expected a boolean, integer, number or string",
                             "dates are not valid here");
    out.push_back({key, *val, location(full)});
  }
  return out;
}

std::vector<std::string> Config::nested_keys(std::string_view dotted) const {
  std::vector<std::string> out;
  const auto* n = lookup(impl_->root, dotted);
  if (n == nullptr || !n->is_table()) return out;
  for (const auto& [k, v] : *n->as_table())
    if (v.is_table() || v.is_array_of_tables()) out.emplace_back(k.str());
  return out;
}

std::vector<TableEntry> Config::table_array(std::string_view dotted,
                                            const std::vector<std::string>& skip) const {
  std::vector<TableEntry> out;
  const auto* n = lookup(impl_->root, dotted);
  if (n == nullptr) return out;
  const auto* a = n->as_array();
  if (a == nullptr)
    throw sdk::ConfigError(location(dotted), std::string(dotted), "expected an array of tables",
                           "write [[" + std::string(dotted) +
                               "]] blocks or a list of inline "
                               "tables: " +
                               std::string(dotted) + " = [ { ... }, { ... } ]");
  for (std::size_t i = 0; i < a->size(); ++i) {
    std::string item = std::string(dotted) + "." + std::to_string(i);
    const auto* t = a->get(i)->as_table();
    if (t == nullptr)
      throw sdk::ConfigError(location(item), std::string(dotted) + "[" + std::to_string(i) + "]",
                             "expected a table", "each entry is a table like { type = \"relu\" }");
    out.push_back({location(item), table_options(item, skip)});
  }
  return out;
}

bool Config::is_array(std::string_view dotted) const {
  const auto* n = lookup(impl_->root, dotted);
  return n != nullptr && n->is_array();
}

std::vector<std::string> Config::string_array(std::string_view dotted) const {
  std::vector<std::string> out;
  const auto* n = lookup(impl_->root, dotted);
  if (n == nullptr) return out;
  if (auto s = n->value_exact<std::string>()) return {*s};
  const auto* a = n->as_array();
  if (a == nullptr)
    throw sdk::ConfigError(location(dotted), std::string(dotted), "expected an array of strings");
  for (std::size_t i = 0; i < a->size(); ++i) {
    auto s = a->get(i)->value_exact<std::string>();
    if (!s)
      throw sdk::ConfigError(location(dotted), std::string(dotted),
                             "entry " + std::to_string(i) + " is not a string");
    out.push_back(*s);
  }
  return out;
}

std::vector<std::int64_t> Config::integer_array(std::string_view dotted) const {
  std::vector<std::int64_t> out;
  const auto* n = lookup(impl_->root, dotted);
  if (n == nullptr) return out;
  const auto* a = n->as_array();
  if (a == nullptr)
    throw sdk::ConfigError(location(dotted), std::string(dotted), "expected an array of integers",
                           "write it as [4, 16]");
  for (std::size_t i = 0; i < a->size(); ++i) {
    auto v = a->get(i)->value_exact<std::int64_t>();
    if (!v)
      throw sdk::ConfigError(location(dotted), std::string(dotted),
                             "entry " + std::to_string(i) + " is not an integer",
                             "write it as [4, 16]");
    out.push_back(*v);
  }
  return out;
}

std::vector<double> Config::number_array(std::string_view dotted) const {
  std::vector<double> out;
  const auto* n = lookup(impl_->root, dotted);
  if (n == nullptr) return out;
  const auto* a = n->as_array();
  if (a == nullptr)
    throw sdk::ConfigError(location(dotted), std::string(dotted), "expected an array of numbers",
                           "write it as [0.5, 0.25]");
  for (std::size_t i = 0; i < a->size(); ++i) {
    const auto* item = a->get(i);
    std::optional<double> v;
    if (auto f = item->value_exact<double>()) v = *f;
    if (auto k = item->value_exact<std::int64_t>()) v = static_cast<double>(*k);
    if (!v)
      throw sdk::ConfigError(location(dotted), std::string(dotted),
                             "entry " + std::to_string(i) + " is not a number",
                             "write it as [0.5, 0.25]");
    out.push_back(*v);
  }
  return out;
}

std::string render_toml(const std::vector<ResolvedSection>& sections) {
  std::string out;
  for (const auto& s : sections) {
    if (!out.empty()) out += "\n";
    for (const auto& c : s.comments) out += "# " + c + "\n";
    out += s.array ? "[[" + s.name + "]]\n" : "[" + s.name + "]\n";
    for (const auto& [k, v] : s.values) {
      if (std::holds_alternative<std::monostate>(v)) continue;
      out += k + " = " + sdk::option_value_to_string(v) + "\n";
    }
    for (const auto& [k, text] : s.raw_values) out += k + " = " + text + "\n";
  }
  return out;
}

}  // namespace mixtrain::core
