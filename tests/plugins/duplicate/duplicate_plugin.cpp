// Provides "test_constant" again (good provides it first), one new scaler, and one component
// without a factory: the duplicate and the factory-less one are ignored with warnings, the new
// one is still registered.
#include "mixtrain/sdk/loss_scaler.h"
#include "mixtrain/sdk/plugin.h"

namespace {

using namespace mixtrain;

class OtherScaler final : public sdk::LossScaler {
 public:
  OtherScaler(const sdk::Options&, const sdk::PluginContext&) {}
  float scale() const override { return 1024.0f; }
  sdk::ScalerDecision update(bool found_inf) override { return {!found_inf, 1024.0f, 1024.0f}; }
  sdk::ComponentState save_state() const override { return {}; }
  void load_state(const sdk::ComponentState&) override {}
};

std::vector<sdk::ComponentInfo> components() {
  using sdk::ComponentKind;
  return {
      {ComponentKind::scaler, "test_constant", "a second provider of test_constant", {},
       &sdk::make_component<OtherScaler>},
      {ComponentKind::scaler, "test_dup_only", "only the duplicate plugin provides this", {},
       &sdk::make_component<OtherScaler>},
      {ComponentKind::scaler, "test_no_factory", "declared without a factory", {}, nullptr},
  };
}

}  // namespace

MIXTRAIN_PLUGIN("test_duplicate", "0.0.1", components)
