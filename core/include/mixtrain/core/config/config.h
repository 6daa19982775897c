// Config: a parsed TOML run description plus `--set key=value` overrides.
//
// Contract
// - from_file()/from_string() parse TOML with TOML++; a syntax error becomes sdk::ConfigError at
//   file:line:col. Overrides use dotted keys ("precision.policy=bf16-mixed",
//   "model.layers.2.out=64"); the value is parsed as a TOML value and, failing that, taken as a
//   string. Values keep their source location (the override itself for --set values).
// - `merges` (`--merge FILE`) are TOML files applied over the config in order, before the
//   overrides: a table merges key by key, any other value replaces the config's (an array of
//   tables such as [[precision.override]] is replaced whole). Their values keep their own
//   file:line:col, and relative paths in them resolve against their own folder (path_base).
// - Accessors return raw values with locations; typing and validation happen against declared
//   schemas (sdk::Options::resolve), so every error names file:line:col and the key.
// - TOML++ stays out of this header: the parsed document is owned by an opaque implementation.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/sdk/options.h"

namespace mixtrain::core {

struct TableEntry {  // one table of an array of tables ([[model.layers]] or inline tables)
  sdk::SourceLocation where;
  std::vector<sdk::RawOption> options;
};

class Config {
 public:
  static Config from_file(const std::filesystem::path& path,
                          const std::vector<std::string>& overrides = {},
                          const std::vector<std::filesystem::path>& merges = {});
  static Config from_string(std::string_view text, const std::string& source_name,
                            const std::vector<std::string>& overrides = {},
                            const std::vector<std::filesystem::path>& merges = {});
  ~Config();
  Config(Config&&) noexcept;
  Config& operator=(Config&&) noexcept;

  const std::string& source_name() const;
  std::filesystem::path base_dir() const;  // relative paths in the config resolve against it

  std::vector<std::string> top_level_keys() const;
  bool has_table(std::string_view dotted) const;
  sdk::SourceLocation location(std::string_view dotted) const;  // of a table or a key
  // Where the key itself was written, for errors about the key rather than its value (an
  // unknown key): its name's file:line:col in the file; a --set's or a --merge's key gives
  // location(), as does a key the file does not hold.
  sdk::SourceLocation key_location(std::string_view dotted) const;
  // Whether `--set` wrote this key, or a table that holds it (`--set 'data.npy={...}'`): such
  // paths resolve against the current folder, as every command line does, while paths written
  // in the file stay relative to the file. location() names that --set for such keys too.
  bool is_override(std::string_view dotted) const;
  // Which layer wrote the key at `dotted`, lowest first: the file, a --merge (a later merge over
  // an earlier one is one layer), a --set. Where two spellings of one option meet (a flat key and
  // its component table's), the higher layer wins; two in one layer are ambiguous.
  enum class Layer { file, merge, set };
  Layer layer(std::string_view dotted) const;
  // The folder a relative path written at `dotted` resolves against: the current folder for a
  // --set, the merged file's folder for a value a --merge wrote, else base_dir().
  std::filesystem::path path_base(std::string_view dotted) const;
  // Scalar entries of a table; arrays of tables and sub-tables are skipped, other arrays raise.
  std::vector<sdk::RawOption> table_options(std::string_view dotted,
                                            const std::vector<std::string>& skip = {}) const;
  // `skip`: keys of each entry that are read otherwise (arrays such as a node's inputs).
  std::vector<TableEntry> table_array(std::string_view dotted,
                                      const std::vector<std::string>& skip = {}) const;
  // Keys of a table whose values are tables or arrays of tables (including dotted keys).
  std::vector<std::string> nested_keys(std::string_view dotted) const;
  // A string is a list of one; [] when absent.
  std::vector<std::string> string_array(std::string_view dotted) const;
  bool is_array(std::string_view dotted) const;  // an array of values or of tables
  std::vector<std::int64_t> integer_array(std::string_view dotted) const;  // [] when absent
  std::vector<double> number_array(std::string_view dotted) const;  // integers widened; [] absent

  struct Impl;  // opaque: keeps TOML++ out of this header

 private:
  explicit Config(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Renders sections of resolved options as TOML text (for DIR/config.toml and `mixtrain check`).
struct ResolvedSection {
  std::string name;  // "scaler", or "model.layers" with `array` set
  bool array = false;
  std::vector<std::pair<std::string, sdk::OptionValue>> values;
  std::vector<std::pair<std::string, std::string>> raw_values;  // key = TOML text (arrays)
  std::vector<std::string> comments;  // written above the section as "# ..."
};
std::string render_toml(const std::vector<ResolvedSection>& sections);

}  // namespace mixtrain::core
