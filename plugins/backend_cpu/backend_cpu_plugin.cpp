// Plugin entry point: exports one component, backend "cpu".
#include <memory>

#include "cpu_backend.h"
#include "mixtrain/sdk/plugin.h"

namespace {

using namespace mixtrain;

std::unique_ptr<sdk::Component> create_cpu_backend(const sdk::Options& options,
                                                   const sdk::PluginContext& context) {
  const auto threads = static_cast<int>(options.get_int("threads"));
  auto backend = std::make_unique<backend_cpu::CpuBackend>(threads);
  context.logger.debug("cpu backend with " + std::to_string(backend->threads()) + " threads");
  return backend;
}

std::vector<sdk::ComponentInfo> backend_cpu_components() {
  return {{sdk::ComponentKind::backend, "cpu",
           "CPU reference backend: oneDNN fp32 GEMM, OpenMP kernels, tf32 emulated",
           {sdk::OptionSpec::integer("threads", 0,
                                     "OpenMP threads for GEMMs and kernels (0 = all cores)")
                .at_least(0)
                .at_most(4096)},
           &create_cpu_backend}};
}

}  // namespace

MIXTRAIN_PLUGIN("backend_cpu", "0.1.0", backend_cpu_components)
