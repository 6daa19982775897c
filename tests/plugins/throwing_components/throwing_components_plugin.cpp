// A plugin whose component list itself cannot be built.
#include <stdexcept>

#include "mixtrain/sdk/plugin.h"

namespace {

std::vector<mixtrain::sdk::ComponentInfo> components() {
  throw std::runtime_error("component table exploded");
}

}  // namespace

MIXTRAIN_PLUGIN("test_throwing_components", "0.0.1", components)
