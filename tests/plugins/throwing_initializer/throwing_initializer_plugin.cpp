// A plugin whose static initializer throws while dlopen runs it: the process cannot go on, and the
// registry must name this library before it aborts.
#include <stdexcept>

#include "mixtrain/sdk/plugin.h"

namespace {

struct ThrowsWhenConstructed {
  ThrowsWhenConstructed() { throw std::runtime_error("static init boom"); }
};
const ThrowsWhenConstructed kThrows;

std::vector<mixtrain::sdk::ComponentInfo> components() {
  return {};
}

}  // namespace

MIXTRAIN_PLUGIN("test_throwing_initializer", "0.0.1", components)
