#include "cli_registry.h"

#include "mixtrain/core/experiment.h"
#include "mixtrain/core/log_sink.h"

namespace mixtrain::cli {

std::unique_ptr<core::PluginRegistry> make_registry(const core::Config* config) {
  auto reg = std::make_unique<core::PluginRegistry>(&core::host_log_sink());
  auto paths = core::PluginRegistry::default_search_path();
  if (config != nullptr)
    for (const auto& p : core::config_plugin_paths(*config)) paths.push_back(p);
  reg->scan(paths);
  return reg;
}

}  // namespace mixtrain::cli
