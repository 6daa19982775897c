// A plugin with the right SDK ABI but built by "another" compiler / standard library.
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

std::vector<sdk::ComponentInfo> components() {
  return {{sdk::ComponentKind::policy,
           "fingerprint_mismatch_policy",
           "must never be registered",
           {},
           &sdk::make_component<NeverPolicy>}};
}

const sdk::PluginDescriptor* descriptor() {
  static const sdk::PluginDescriptor d{sdk::kSdkAbiVersion, "othercc-99/otherstdlib/c++20",
                                       "test_fingerprint_mismatch", "0.0.1", components};
  return &d;
}

}  // namespace

BOOST_DLL_ALIAS(descriptor, mixtrain_plugin_descriptor)
