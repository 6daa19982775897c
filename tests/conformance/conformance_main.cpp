// mixtrain's own conformance run: every backend plugin in the build's plugin folder, checked
// against the CPU backend. A backend whose factory fails here (no device) is skipped, visibly.
#include <gtest/gtest.h>

#include "mixtrain/conformance/backend_conformance.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/registry.h"

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
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
