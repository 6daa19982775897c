// A plugin built without the support library it calls (mixtrain::sdk_support): every plugin
// carries those helpers itself, and nothing exports them to it (the core's copy is hidden), so
// dlopen(RTLD_NOW) must refuse it, and the registry must say how to build it.
#include "mixtrain/sdk/plugin.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace {

std::vector<mixtrain::sdk::ComponentInfo> components() {
  // The call keeps a relocation against the support library's function in the library.
  if (mixtrain::sdk::decode_fp16(0) != 0.0f) return {};
  return {};
}

}  // namespace

MIXTRAIN_PLUGIN("test_without_support", "0.0.1", components)
