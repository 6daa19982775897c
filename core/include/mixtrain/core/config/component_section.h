// A config section that selects one component of a kind: [backend] type, [precision] policy,
// [scaler] type, [optimizer] type, [checkpoint] format, [data] source.
//
// Layout (one rule for every such section)
// - The selector key names the component; the host's own keys of the section (schedule, every,
//   batch_size, ...) sit beside it.
// - A component's options live in a table named after it ([scaler.dynamic] growth_interval = 20).
//   Only the selected component's table is used; the tables of the other known components are
//   still validated against their schemas, so a typo is caught before the user swaps to them.
//   This is what lets `--set scaler.type=static` work on a file that also configures `dynamic`.
//   Each key of such a table is named in ResolvedComponentSection::unused with the selector that
//   leaves it unread: a key the user meant to apply (`--set data.cifar10.train=...` under
//   source = "text") must not do nothing without a word.
// - Flat keys beside the selector (the older form, and what `--set scaler.growth_interval=20`
//   writes) apply to whichever component is selected and must be valid for it. A flat key that
//   only an unselected sibling declares is an error that says to select that sibling, or to move
//   the key into its table to keep it for later. A flat key no component declares (a misspelt
//   selector) is refused first, at its own location, before a sibling's key is blamed against a
//   selection the typo left at its default.
// - Flat keys and the selected component's table combine: a required option may come from
//   either (the file's table and a --set, say). A key given both ways in the file is an error;
//   a --set beats the file, whichever spelling either used. Unselected tables are checked for
//   unknown keys, types and ranges, not for missing required keys.
// - A table named after no installed component is an error (with a "did you mean"), as an
//   unknown key is: a value written as a table (beta1 = { ... }) is never silently dropped.
//   Unless the section says `unknown_tables_are_warnings` (a command that does not use the
//   section: ExperimentUse::model_only), where it is one line in ResolvedComponentSection::warnings
//   and its contents are not read.
//
// Errors are sdk::ConfigError at the key's file:line:col (or the --set that wrote it).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "mixtrain/core/config/config.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/plugin.h"

namespace mixtrain::core {

struct ComponentSchema {
  std::string name;           // "dynamic"
  sdk::OptionSchema options;  // its declared options
  // String options that may also be written as a list of strings (a list of files). An array is
  // validated as that string option, its entries joined by '\n'; the reader takes the entries
  // with Config::string_array at the key's origin. Elsewhere an array is an error.
  std::vector<std::string> list_options = {};
};

struct ComponentSection {
  std::string table;       // "scaler"
  std::string selector;    // "type"
  std::string noun;        // "scaler": used in messages ("the selected scaler 'dynamic'")
  std::string selected;    // the component chosen (already checked to exist)
  sdk::OptionSchema host;  // keys the host reads in this section
  std::vector<ComponentSchema> components;  // every known component of the kind, selected included
  std::vector<std::string> host_tables;     // sub-tables the host reads itself ("override")
  // Host keys whose value is a list of integers ([optimizer] milestones). The host schema
  // declares each as a string: the list reaches it as its TOML text ("[100, 200]"), so its
  // location, was_set and the resolved config work as for scalars, and the reader takes the
  // entries with Config::integer_array. A scalar there is a ConfigError asking for a list.
  std::vector<std::string> host_lists = {};
  // A table named after no known component is a warning, not an error (see the layout above).
  bool unknown_tables_are_warnings = false;
};

struct ResolvedComponentSection {
  sdk::Options host;
  sdk::Options component;
  // For each component option given in the config: the dotted key it was read from
  // ("data.npy.features" or "data.features"), so paths resolve against the right base.
  std::map<std::string, std::string> origin;
  // With unknown_tables_are_warnings: one line per table named after no known component.
  std::vector<std::string> warnings;
  // One line per key of an unselected component's table: where it is, and the selector that
  // leaves it unread (for Experiment::unused_keys, which the trainer warns about).
  std::vector<std::string> unused;
};

// The config section that selects components of `kind`: "precision" for policies, "checkpoint"
// for checkpoint formats, the kind's own name otherwise.
std::string config_section_of(sdk::ComponentKind kind);

// The selector's value (or `fallback` when absent), checked to be a string. `lists`: keys of the
// table that may hold arrays (every component's list_options), passed over here.
std::string section_selector(const Config& config, const std::string& table,
                             const std::string& selector, const std::string& fallback,
                             const std::vector<std::string>& lists = {});

// Of the host's sub-tables (`host_tables`: "override", "escalate"), those `table` gives as an
// array: the host reads them itself (an empty `override = []` is an array to TOML, not a table
// array, and means none), so a scalar reading of `table` passes them over.
std::vector<std::string> host_tables_given_as_arrays(const Config& config, const std::string& table,
                                                     const std::vector<std::string>& host_tables);

ResolvedComponentSection resolve_component_section(const Config& config,
                                                   const ComponentSection& section);

}  // namespace mixtrain::core
