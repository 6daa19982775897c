// Provides "test_constant" again (good provides it first), one new scaler, one component without a
// factory, and five whose option schemas are broken (a default outside its range, a NaN or an
// infinite default, a default that is not one of its choices, a name declared twice): all but the
// new scaler are ignored with warnings, and the new one is still registered. Two more declare an
// option named like a key the host keeps in their section ([scaler]'s selector, [optimizer]'s
// warmup_steps), and are ignored with warnings as well.
// Four more no config could select (an empty name, a dot, a space, a kind out of the enum) are
// ignored with warnings.
#include <limits>

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
      {ComponentKind::scaler,
       "test_constant",
       "a second provider of test_constant",
       {},
       &sdk::make_component<OtherScaler>},
      {ComponentKind::scaler,
       "test_dup_only",
       "only the duplicate plugin provides this",
       {},
       &sdk::make_component<OtherScaler>},
      {ComponentKind::scaler, "test_no_factory", "declared without a factory", {}, nullptr},
      {ComponentKind::scaler,
       "test_default_out_of_range",
       "a default below its minimum",
       {sdk::OptionSpec::integer("n", 0, "count").at_least(1)},
       &sdk::make_component<OtherScaler>},
      {ComponentKind::scaler,
       "test_nan_default",
       "a NaN default",
       {sdk::OptionSpec::number("x", std::numeric_limits<double>::quiet_NaN(), "value")},
       &sdk::make_component<OtherScaler>},
      {ComponentKind::scaler,
       "test_inf_default",
       "an infinite default with no infinite bound",
       {sdk::OptionSpec::number("x", std::numeric_limits<double>::infinity(), "value").at_least(0)},
       &sdk::make_component<OtherScaler>},
      {ComponentKind::scaler,
       "test_default_not_a_choice",
       "a default outside its choices",
       {sdk::OptionSpec::string("mode", "fast", "mode").one_of({"slow", "steady"})},
       &sdk::make_component<OtherScaler>},
      {ComponentKind::scaler,
       "test_declares_type",
       "an option named like [scaler]'s selector",
       {sdk::OptionSpec::string("type", "mine", "shadowed by the host's selector")},
       &sdk::make_component<OtherScaler>},
      // Never created (it is ignored at load), so a scaler's factory serves.
      {ComponentKind::optimizer,
       "test_declares_warmup_steps",
       "an option named like one of [optimizer]'s schedule keys",
       {sdk::OptionSpec::integer("warmup_steps", 0, "shadowed by the host's schedule key")},
       &sdk::make_component<OtherScaler>},
      {ComponentKind::scaler, "", "an empty name", {}, &sdk::make_component<OtherScaler>},
      {ComponentKind::scaler,
       "test.dotted",
       "a dotted name",
       {},
       &sdk::make_component<OtherScaler>},
      {ComponentKind::scaler,
       "test spaced",
       "a name with a space",
       {},
       &sdk::make_component<OtherScaler>},
      {static_cast<ComponentKind>(99),
       "test_kind_99",
       "a kind out of the enum",
       {},
       &sdk::make_component<OtherScaler>},
      {ComponentKind::scaler,
       "test_option_twice",
       "one option declared twice",
       {sdk::OptionSpec::number("x", 1.0, "value"), sdk::OptionSpec::number("x", 2.0, "again")},
       &sdk::make_component<OtherScaler>},
  };
}

}  // namespace

MIXTRAIN_PLUGIN("test_duplicate", "0.0.1", components)
