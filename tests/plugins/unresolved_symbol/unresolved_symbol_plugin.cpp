// A plugin that references a function no library defines. It links (see CMakeLists.txt) but
// dlopen(RTLD_NOW) must refuse it, naming the symbol.
#include "mixtrain/sdk/plugin.h"

// Default visibility: a hidden undefined symbol would be rejected by the linker already.
extern "C" __attribute__((visibility("default"))) int mixtrain_test_missing_symbol(int);

namespace {

std::vector<mixtrain::sdk::ComponentInfo> components() {
  // The call keeps a relocation against the missing symbol in the library.
  if (mixtrain_test_missing_symbol(1) == 0) return {};
  return {};
}

}  // namespace

MIXTRAIN_PLUGIN("test_unresolved_symbol", "0.0.1", components)
