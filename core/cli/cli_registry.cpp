#include "cli_registry.h"

#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/console/log_sink.h"

namespace mixtrain::cli {

std::unique_ptr<core::PluginRegistry> make_registry(const core::Config* config) {
  auto reg = std::make_unique<core::PluginRegistry>(&core::host_log_sink());
  auto paths = core::PluginRegistry::default_search_path();
  if (config != nullptr)
    for (const auto& p : core::config_plugin_paths(*config)) paths.push_back(p);
  reg->scan(paths);
  // `plugins` lists failures itself; a run says so once, so a half-copied plugin whose
  // components go missing is not a silent surprise.
  if (config != nullptr) {
    auto log = core::core_logger("plugins");
    for (const auto& l : reg->libraries())
      if (!l.loaded)
        log.warn("plugin library " + l.path.string() + " was skipped: " + l.error +
                 " (`mixtrain plugins` lists every library)");
  }
  return reg;
}

}  // namespace mixtrain::cli
