// The plugins this build made (MIXTRAIN_PLUGIN_DIR), scanned once per test process, for the
// integration tests that run a Trainer in process.
#pragma once

#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/registry.h"

namespace mixtrain::test {

inline core::PluginRegistry& built_plugins() {
  static core::PluginRegistry r(&core::host_log_sink());
  static bool scanned = false;
  if (!scanned) {
    r.scan({MIXTRAIN_PLUGIN_DIR});
    scanned = true;
  }
  return r;
}

}  // namespace mixtrain::test
