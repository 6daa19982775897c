// Scalers whose factories fail in the ways a plugin can fail: an internal error, a user error,
// a config error about one of its options, a null result and an object of the wrong interface;
// and two built fine that throw from their first update(): a non-standard exception, and a
// std::runtime_error (a fault of the plugin's, which the command's end names the plugins for).
#include <stdexcept>

#include "mixtrain/sdk/loss_scaler.h"
#include "mixtrain/sdk/plugin.h"
#include "mixtrain/sdk/precision_policy.h"

namespace {

using namespace mixtrain;

std::unique_ptr<sdk::Component> throws_runtime(const sdk::Options&, const sdk::PluginContext&) {
  throw std::runtime_error("runtime boom in the factory");
}

std::unique_ptr<sdk::Component> throws_user(const sdk::Options&, const sdk::PluginContext&) {
  throw sdk::UserError("user boom in the factory", "set something else");
}

std::unique_ptr<sdk::Component> throws_config(const sdk::Options& options,
                                              const sdk::PluginContext&) {
  options.fail("level", "level 7 is not supported here", "use a smaller level");
}

std::unique_ptr<sdk::Component> throws_int(const sdk::Options&, const sdk::PluginContext&) {
  throw 42;
}

std::unique_ptr<sdk::Component> returns_null(const sdk::Options&, const sdk::PluginContext&) {
  return nullptr;
}

class SomePolicy final : public sdk::PrecisionPolicy {
 public:
  SomePolicy(const sdk::Options&, const sdk::PluginContext&) {}
  sdk::OpPrecision plan(const sdk::OpDescription&) const override { return {}; }
  bool needs_loss_scaling() const override { return false; }
};

class UpdateThrowsInt final : public sdk::LossScaler {
 public:
  UpdateThrowsInt(const sdk::Options&, const sdk::PluginContext&) {}
  float scale() const override { return 1.0f; }
  sdk::ScalerDecision update(bool) override { throw 7; }
  sdk::ComponentState save_state() const override { return {}; }
  void load_state(const sdk::ComponentState&) override {}
};

class UpdateThrowsRuntime final : public sdk::LossScaler {
 public:
  UpdateThrowsRuntime(const sdk::Options&, const sdk::PluginContext&) {}
  float scale() const override { return 1.0f; }
  sdk::ScalerDecision update(bool) override { throw std::runtime_error("update boom"); }
  sdk::ComponentState save_state() const override { return {}; }
  void load_state(const sdk::ComponentState&) override {}
};

std::vector<sdk::ComponentInfo> components() {
  using sdk::ComponentKind;
  return {
      {ComponentKind::scaler,
       "test_throws_runtime",
       "factory throws std::runtime_error",
       {},
       &throws_runtime},
      {ComponentKind::scaler,
       "test_throws_user",
       "factory throws sdk::UserError",
       {},
       &throws_user},
      {ComponentKind::scaler,
       "test_throws_config",
       "factory rejects an option",
       {sdk::OptionSpec::integer("level", 7, "a level")},
       &throws_config},
      {ComponentKind::scaler,
       "test_throws_int",
       "factory throws a non-standard exception",
       {},
       &throws_int},
      {ComponentKind::scaler, "test_returns_null", "factory returns nothing", {}, &returns_null},
      {ComponentKind::scaler,
       "test_update_throws_int",
       "update() throws a non-standard exception",
       {},
       &sdk::make_component<UpdateThrowsInt>},
      {ComponentKind::scaler,
       "test_update_throws_runtime",
       "update() throws std::runtime_error",
       {},
       &sdk::make_component<UpdateThrowsRuntime>},
      {ComponentKind::scaler,
       "test_wrong_interface",
       "registered as a scaler, builds a policy",
       {},
       &sdk::make_component<SomePolicy>},
  };
}

}  // namespace

MIXTRAIN_PLUGIN("test_throwing_factory", "0.0.1", components)
