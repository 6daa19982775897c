// mixtrain's own conformance run: every backend plugin in the build's plugin folder, checked
// against the CPU backend (a backend whose factory fails here, no device, is skipped, visibly),
// and the built-in scalers and optimizers through the component kit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "mixtrain/conformance/backend_conformance.h"
#include "mixtrain/conformance/component_conformance.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/registry.h"

// Backends the kit must fail (faulty_backends_fail.sh).
#include "faulty_backends.h"

// The samples a plugin author starts from (samples/), compiled in: they must pass the kit too.
#include "adaptive_loss_scaler.h"
#include "lion_optimizer.h"

namespace {

using namespace mixtrain;

// Components that break the kit's contracts, registered only with MIXTRAIN_CONFORMANCE_FAULTS=1
// (faulty_components_fail.sh): the kit must fail them.
class AppliesOverflows final : public sdk::LossScaler {
 public:
  float scale() const override { return 1024.0f; }
  sdk::ScalerDecision update(bool) override { return {true, 1024.0f, 1024.0f}; }
  sdk::ComponentState save_state() const override { return {}; }
  void load_state(const sdk::ComponentState&) override {}
};

// SGD whose step leaves the working copies as they were.
class StaleWorkingCopies final : public sdk::Optimizer {
 public:
  explicit StaleWorkingCopies(std::shared_ptr<sdk::Optimizer> sgd) : sgd_(std::move(sgd)) {}
  double base_lr() const override { return sgd_->base_lr(); }
  void bind(sdk::DeviceBackend& b, std::span<const sdk::Parameter> params) override {
    sgd_->bind(b, params);
  }
  void step(sdk::DeviceBackend& b, std::span<const sdk::Parameter> params,
            const sdk::StepContext& ctx) override {
    std::vector<std::vector<std::byte>> kept;
    for (const auto& p : params) {
      kept.emplace_back(p.tensors.working.data ? p.tensors.working.bytes() : 0);
      if (p.tensors.working.data) b.copy_to_host(kept.back().data(), p.tensors.working);
    }
    sgd_->step(b, params, ctx);
    for (std::size_t i = 0; i < params.size(); ++i)
      if (params[i].tensors.working.data)
        b.copy_from_host(params[i].tensors.working, kept[i].data());
  }
  std::vector<sdk::NamedTensorView> state_tensors() const override { return sgd_->state_tensors(); }
  sdk::ComponentState save_state() const override { return sgd_->save_state(); }
  void load_state(const sdk::ComponentState& s) override { sgd_->load_state(s); }

 private:
  std::shared_ptr<sdk::Optimizer> sgd_;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace mixtrain;
  static core::PluginRegistry registry(&core::host_log_sink());
  registry.scan({MIXTRAIN_PLUGIN_DIR});
  conformance::set_plugin_search_path({MIXTRAIN_PLUGIN_DIR});
  auto factory = [](const core::LoadedComponent& c, std::vector<sdk::RawOption> raw = {}) {
    return [&c, raw]() {
      auto options = sdk::Options::resolve("backend", c.info.options, raw, {});
      return registry.create<sdk::DeviceBackend>(c, options);
    };
  };
  const auto& cpu = registry.require(sdk::ComponentKind::backend, "cpu");
  conformance::set_reference(factory(cpu));
  for (const auto& c : registry.components())
    if (c.info.kind == sdk::ComponentKind::backend && c.info.name != "cpu")
      conformance::add_backend(c.info.name, factory(c), {"backend.type=" + c.info.name});
  // The CPU backend on one thread: another accumulation order, so the suite's tolerances are
  // exercised even on a machine with no other backend; and flash attention's bf16 tile products
  // (P and dS rounded to bf16, as a GPU's flash attention does), which the reference takes only
  // on an AMX CPU.
  conformance::add_backend(
      "cpu_one_thread",
      factory(cpu, {{"threads", std::int64_t{1}, {}}, {"flash_products", std::string("bf16"), {}}}),
      {"backend.type=cpu", "backend.threads=1", "backend.flash_products=bf16"});
  // The built-in scalers and optimizers through the component kit, each as a config would make it.
  const std::vector<std::filesystem::path> plugins = {MIXTRAIN_PLUGIN_DIR};
  conformance::add_scaler("dynamic", conformance::scaler_from_plugin(plugins, "dynamic"));
  conformance::add_scaler("dynamic_hysteresis",
                          conformance::scaler_from_plugin(plugins, "dynamic",
                                                          {{"hysteresis", std::int64_t{3}},
                                                           {"growth_interval", std::int64_t{7}},
                                                           {"min_scale", 1.0}}));
  conformance::add_scaler("static", conformance::scaler_from_plugin(plugins, "static"));
  conformance::add_scaler("none", conformance::scaler_from_plugin(plugins, "none"));
  conformance::add_optimizer("sgd", conformance::optimizer_from_plugin(plugins, "sgd"));
  conformance::add_optimizer(
      "sgd_nesterov",
      conformance::optimizer_from_plugin(
          plugins, "sgd", {{"momentum", 0.9}, {"nesterov", true}, {"weight_decay", 0.01}}));
  conformance::add_optimizer("adamw", conformance::optimizer_from_plugin(plugins, "adamw"));
  conformance::add_scaler("sample_adaptive", [] {
    return std::make_shared<mixtrain_samples::AdaptiveLossScaler>(
        sdk::Options::resolve("scaler.adaptive",
                              mixtrain_samples::AdaptiveLossScaler::option_schema(), {}, {}),
        sdk::PluginContext{});
  });
  conformance::add_optimizer("sample_lion", [] {
    return std::make_shared<mixtrain_samples::LionOptimizer>(
        sdk::Options::resolve("optimizer.lion", mixtrain_samples::LionOptimizer::option_schema(),
                              {{"weight_decay", 0.1, {}}}, {}),
        sdk::PluginContext{});
  });
  if (const char* faults = std::getenv("MIXTRAIN_CONFORMANCE_FAULTS");
      faults != nullptr && std::strcmp(faults, "1") == 0) {
    conformance::add_scaler("faulty_applies_overflows",
                            [] { return std::make_shared<AppliesOverflows>(); });
    const auto sgd = conformance::optimizer_from_plugin(plugins, "sgd");
    conformance::add_optimizer("faulty_stale_working_copies",
                               [sgd] { return std::make_shared<StaleWorkingCopies>(sgd()); });
    // Factories that throw, as a typo makes them: their tests must fail, never skip.
    conformance::add_scaler("faulty_unknown_name",
                            conformance::scaler_from_plugin(plugins, "no_such_scaler"));
    conformance::add_optimizer(
        "faulty_unknown_option",
        conformance::optimizer_from_plugin(plugins, "sgd", {{"no_such_option", 1.0}}));
    for (auto& [name, make] : conformance::faults::faulty_backends(factory(cpu)))
      conformance::add_backend(name, std::move(make));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
