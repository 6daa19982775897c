// Every section a config may hold, with the keys it takes: what `mixtrain describe` prints.
//
// Contract
// - The keys come from the schemas that validate configs: the host's (host_schemas.h) for its own
//   tables, each loaded component's ComponentInfo::options for a component table
//   ([scaler.dynamic]), the op table's layer schemas for "layer.TYPE". A description therefore
//   cannot drift from the checks; only the arrays the host reads beside a schema (model layers,
//   resnet blocks and widths, plugin paths) are listed here by hand, as `extra` rows.
// - Names are TOML paths ("run", "data.npy", "precision.override", "scaler.dynamic"), except
//   "layer.TYPE": one entry of [model] layers/nodes (an inline table, not a section).
// - Sections come in the order a config is usually written: run, data and its sources, model,
//   precision, scaler, optimizer, checkpoint, backend, ema, eval, plugins, then the layers.
// - config_top_level_tables() is the list parse_experiment() accepts at the top of a file.
// - find_config_section() throws sdk::UserError for an unknown name, with a "did you mean" and
//   the list of top-level sections.
#pragma once

#include <string>
#include <vector>

#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain::core {

// One key as `describe` prints it.
struct SectionKey {
  std::string name, type, default_text, range, doc;
};

struct ConfigSection {
  std::string name;     // "scaler.dynamic"
  std::string summary;  // what the section configures, one line
  std::string origin;   // "host", or "plugin 'scalers' 0.1.0 (/path/libmixtrain_scalers.so)"
  // A section that selects a component ([scaler] type, [data] source): the key, its value when
  // absent, and the components or sources it may name (each has its own section NAME.choice).
  std::string selector, selector_default;
  std::vector<std::string> choices;
  std::vector<SectionKey> keys;  // besides the selector
  bool array_of_tables = false;  // [[precision.override]]
};

const std::vector<std::string>& config_top_level_tables();

// A key the schema declares as a string but the host reads as a list (optimizer.milestones,
// run.metrics): its name and the type of its entries ("integer", "string").
struct ListKey {
  std::string name, entries;
};

// The rows of `schema`; `lists` are its keys read as lists.
std::vector<SectionKey> section_keys(const sdk::OptionSchema& schema,
                                     const std::vector<ListKey>& lists = {});

std::vector<ConfigSection> config_sections(const PluginRegistry& registry);

// The keys the section of `kind` keeps for mixtrain beside its component's options: the selector
// and the host's keys ([optimizer]'s schedule, [checkpoint]'s every, keep, ...). A flat key of
// such a name always goes to the host, so a component option of one could never be set flat:
// the registry ignores such a component at load, with a warning (plugins/registry.h).
std::vector<std::string> host_owned_keys(sdk::ComponentKind kind);

const ConfigSection& find_config_section(const std::vector<ConfigSection>& sections,
                                         const std::string& name);

}  // namespace mixtrain::core
