// The plugin registry every `mixtrain` command uses: the default search path (the folder next to
// the executable, then MIXTRAIN_PLUGIN_PATH), then the config's [plugins] paths when a config is
// given. Log lines go to the host log sink. With a config, each [plugins] paths entry that can load
// nothing (missing, or a folder without a libmixtrain_*.so) is warned about at its config location,
// and so is every library that failed to load.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/config/config.h"
#include "mixtrain/core/plugins/registry.h"

namespace mixtrain::cli {

std::unique_ptr<core::PluginRegistry> make_registry(const core::Config* config);

// The plugin libraries the registries of this command loaded from outside mixtrain's own plugin
// folder, one text each ("libchaos.so (plugin chaos 0.1)"): where an error that is not one of
// mixtrain's own may come from. Empty when it loaded none.
const std::vector<std::string>& outside_plugins();

}  // namespace mixtrain::cli
