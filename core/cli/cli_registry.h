// The plugin registry every `mixtrain` command uses: the default search path (the folder next to
// the executable, then MIXTRAIN_PLUGIN_PATH), then the config's [plugins] paths when a config is
// given. Log lines go to the host log sink.
#pragma once

#include <memory>

#include "mixtrain/core/config/config.h"
#include "mixtrain/core/plugins/registry.h"

namespace mixtrain::cli {

std::unique_ptr<core::PluginRegistry> make_registry(const core::Config* config);

}  // namespace mixtrain::cli
