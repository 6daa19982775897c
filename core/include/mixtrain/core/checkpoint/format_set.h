// The checkpoint formats a command reads and writes, each with its name and origin, and the rule
// for two that claim one file extension.
//
// A format is picked for a file by its extension (a run folder's step-N<ext>, an init_from or
// --checkpoint file), so two formats with one extension would make the pick an accident of the
// search order: a tbck file read as native fails "not a mixtrain native checkpoint", or one
// plugin's file is read by another. The rule:
// - the configured format (checkpoint.format, export's --format) may not share its extension
//   with any other loaded format, unless it is one of mixtrain's own (native, safetensors): it is
//   what the command writes, so the clash is a PluginError naming both formats and the fix;
// - a format loaded only to read weights (every other) that claims an extension an earlier one
//   has is left out, with a warning naming both: the configured format first, then registry
//   order, in which mixtrain's own plugin folder comes before MIXTRAIN_PLUGIN_PATH and [plugins]
//   paths, so a built-in always keeps its extension.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/sdk/checkpoint_format.h"

namespace mixtrain::core {

struct NamedFormat {
  std::string name;  // as checkpoint.format names it
  // Its plugin and library ("plugin tb_ckpt 1.0.0, libmixtrain_tb_ckpt.so").
  std::string origin;
  // Loaded from mixtrain's own plugin folder: its errors and files are mixtrain's.
  bool builtin = false;
  std::shared_ptr<sdk::CheckpointFormat> format;

  // "checkpoint format 'tbck' (plugin tb_ckpt 1.0.0, libmixtrain_tb_ckpt.so)".
  std::string label() const;
};

// c's format as created, named.
NamedFormat named_format(const LoadedComponent& c, std::shared_ptr<sdk::CheckpointFormat> format);

// `configured` first (null format: none), then `others` in their order, less those whose
// extension an earlier one claims (one warning each in `warnings`). Throws sdk::PluginError when
// another claims the configured one's extension and the configured one is not a built-in; `key`
// names what configured it in that message ("checkpoint.format", "--format").
std::vector<NamedFormat> formats_by_extension(const NamedFormat& configured,
                                              std::vector<NamedFormat> others,
                                              const std::string& key,
                                              std::vector<std::string>& warnings);

}  // namespace mixtrain::core
