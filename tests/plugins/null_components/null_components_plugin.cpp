// A hand-written descriptor whose components function pointer is null: the host must report it,
// not call through it.
#include "mixtrain/sdk/plugin.h"

namespace {

const mixtrain::sdk::PluginDescriptor* descriptor() {
  static const mixtrain::sdk::PluginDescriptor d{mixtrain::sdk::kSdkAbiVersion,
                                                 MIXTRAIN_BUILD_FINGERPRINT,
                                                 "test_null_components", "0.0.1", nullptr};
  return &d;
}

}  // namespace

BOOST_DLL_ALIAS(descriptor, mixtrain_plugin_descriptor)
