// The quickstart's experiment and components, in process: its embedded config with `sets` applied
// (or any config's text), and the components the build's plugins make, the plugin folder scanned
// once per test process.
// For integration tests that wrap the backend (a forwarding backend that counts or checks calls)
// before the trainer runs. The test target needs ${PROJECT_BINARY_DIR}/core/cli on its include
// path (embedded_quickstart.h) and MIXTRAIN_PLUGIN_DIR defined.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "embedded_quickstart.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/registry.h"

namespace mixtrain::test {

struct QuickstartSetup {
  core::Experiment experiment;
  core::Components components;
};

// The experiment and components of a config's text, `origin` naming it in messages.
inline QuickstartSetup config_components(const std::string& toml, const std::string& origin,
                                         const std::vector<std::string>& sets = {}) {
  static core::PluginRegistry registry(&core::host_log_sink());
  static bool scanned = false;
  if (!scanned) {
    registry.scan({MIXTRAIN_PLUGIN_DIR});
    scanned = true;
  }
  const auto config = core::Config::from_string(toml, origin, sets);
  QuickstartSetup s{core::parse_experiment(config, registry), {}};
  s.components = core::create_components(s.experiment, registry);
  return s;
}

inline QuickstartSetup quickstart_components(const std::vector<std::string>& sets) {
  return config_components(kEmbeddedQuickstartToml, "quickstart.toml", sets);
}

}  // namespace mixtrain::test
