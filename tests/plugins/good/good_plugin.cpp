// A well-formed plugin: a scaler with a declared schema and a policy. The registry tests load,
// list and create from it, and use it to show that broken neighbours do not affect it.
#include <string>

#include "mixtrain/sdk/loss_scaler.h"
#include "mixtrain/sdk/plugin.h"
#include "mixtrain/sdk/precision_policy.h"

namespace {

using namespace mixtrain;

class ConstantScaler final : public sdk::LossScaler {
 public:
  static sdk::OptionSchema option_schema() {
    return {
        sdk::OptionSpec::number("scale", 2.0, "constant loss scale").greater_than(0),
        sdk::OptionSpec::string("mode", "fixed", "how update() behaves").one_of({"fixed", "halve"}),
    };
  }

  ConstantScaler(const sdk::Options& options, const sdk::PluginContext& context)
      : scale_(static_cast<float>(options.get_double("scale"))),
        halve_(options.get_string("mode") == "halve") {
    // Lets the tests see which logger and names the host handed to the factory.
    context.logger.info("created by plugin '" + context.plugin_name + "' as '" +
                        context.component_name + "'");
  }

  float scale() const override { return scale_; }
  sdk::ScalerDecision update(bool found_inf) override {
    const float before = scale_;
    if (found_inf && halve_) scale_ /= 2;
    return {!found_inf, before, scale_};
  }
  sdk::ComponentState save_state() const override {
    sdk::ComponentState s;
    s.values["scale"] = static_cast<double>(scale_);
    return s;
  }
  void load_state(const sdk::ComponentState& s) override {
    scale_ = static_cast<float>(s.get<double>("scale"));
  }

 private:
  float scale_;
  bool halve_;
};

class Fp32Policy final : public sdk::PrecisionPolicy {
 public:
  Fp32Policy(const sdk::Options&, const sdk::PluginContext&) {}
  sdk::OpPrecision plan(const sdk::OpDescription&) const override { return {}; }
  bool needs_loss_scaling() const override { return false; }
};

std::vector<sdk::ComponentInfo> components() {
  return {
      {sdk::ComponentKind::scaler, "test_constant", "test scaler with a constant scale",
       ConstantScaler::option_schema(), &sdk::make_component<ConstantScaler>},
      {sdk::ComponentKind::policy,
       "test_fp32",
       "test policy: everything fp32",
       {},
       &sdk::make_component<Fp32Policy>},
  };
}

}  // namespace

MIXTRAIN_PLUGIN("test_good", "1.2.3", components)
