// A plugin built against "another" SDK ABI. The descriptor is written by hand because
// MIXTRAIN_PLUGIN always stamps the current kSdkAbiVersion.
#include "mixtrain/sdk/plugin.h"
#include "mixtrain/sdk/precision_policy.h"

namespace {

using namespace mixtrain;

class NeverPolicy final : public sdk::PrecisionPolicy {
 public:
  NeverPolicy(const sdk::Options&, const sdk::PluginContext&) {}
  sdk::OpPrecision plan(const sdk::OpDescription&) const override { return {}; }
  bool needs_loss_scaling() const override { return false; }
};

// The host must not call this: past a mismatched ABI version nothing but the first two members
// may be read. If it did, the component would show up and the test would catch it.
std::vector<sdk::ComponentInfo> components() {
  return {{sdk::ComponentKind::policy,
           "abi_mismatch_policy",
           "must never be registered",
           {},
           &sdk::make_component<NeverPolicy>}};
}

const sdk::PluginDescriptor* descriptor() {
  static const sdk::PluginDescriptor d{sdk::kSdkAbiVersion + 100, MIXTRAIN_BUILD_FINGERPRINT,
                                       "test_abi_mismatch", "0.0.1", components};
  return &d;
}

}  // namespace

BOOST_DLL_ALIAS(descriptor, mixtrain_plugin_descriptor)
