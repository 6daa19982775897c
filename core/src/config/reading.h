// Helpers the config readers share (config/experiment.cpp and the per-section readers such as
// config/model_section.cpp, config/data_section.cpp): raw-key access with locations, resolved-config sections,
// nested-table rejection and path resolution. Internal to the core.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mixtrain/core/config/component_section.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain::core {

// The string value of `key` in a table's raw entries (`def` when absent); a non-string value is
// a ConfigError at its location.
std::string string_key(const std::vector<sdk::RawOption>& raw, const std::string& key,
                       const std::string& def, const std::string& table);
sdk::SourceLocation key_location(const std::vector<sdk::RawOption>& raw, const std::string& key,
                                 const sdk::SourceLocation& fallback);
ResolvedSection section_of(const std::string& name,
                           const std::vector<std::pair<std::string, sdk::OptionValue>>& head,
                           const sdk::Options& o1, const sdk::Options* o2 = nullptr);
// Sub-tables the host does not read would otherwise be dropped without a word.
void reject_nested(const Config& config, const std::string& table,
                   const std::vector<std::string>& allowed = {});
// The selected component's options as a resolved-config section of their own:
// [scaler] type = "dynamic" is followed by [scaler.dynamic] growth_interval = ...
void push_component(std::vector<ResolvedSection>& sections, const std::string& table,
                    const std::string& selector, const std::string& name, const sdk::Options& host,
                    const sdk::Options& component);
// A path the config gives at `key`: relative to the config file's folder when written there, to
// the current folder when given with --set (as every command line does). Absolute in the
// resolved config, so DIR/config.toml reproduces the run from anywhere.
std::filesystem::path config_path(const Config& config, const std::string& key,
                                  const std::filesystem::path& p);
// A component's file path option, read from whichever spelling gave it ([data.npy] or flat).
std::filesystem::path resolve_path(const Config& config, const ResolvedComponentSection& r,
                                   const std::string& key);
// The resolved config shows `key` as the value the run uses (an absolute path, say).
void show_resolved(ResolvedSection& section, const std::string& key, const std::string& value);
std::string join_names(const std::vector<std::string>& names);
// Whether `key` was given at a value other than its schema default: only such a key changes
// anything where it is read, so only such a key is reported when it is not. (A run folder's
// resolved config.toml writes every key at its value, defaults included; reading it back, as
// `train --resume RUN`, `eval` and `sample` do, must not call those unused.)
bool set_away_from_default(const sdk::Options& o, const sdk::OptionSchema& schema,
                           std::string_view key);
// A table the config gives but does not select (a sibling component's, another preset's), checked
// against its own schema: unknown keys, types and ranges. Its required keys are not asked for:
// they matter only where the table is the one read. Throws sdk::ConfigError.
void check_unselected_table(const std::string& dotted, const sdk::OptionSchema& schema,
                            const std::vector<sdk::RawOption>& raw,
                            const sdk::SourceLocation& where);

}  // namespace mixtrain::core
