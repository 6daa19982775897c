// A backend that cannot run every FP32 model: the CPU backend with its layer-norm facet hidden,
// as a GPU backend built without a kernel would be. Models without a layernorm run exactly as on
// "cpu"; one with a layernorm must stop at plan time naming the node (`mixtrain calibrate`'s
// bad-input test, tests/integration/test_calibrate.cpp).
#include <memory>
#include <string_view>

#include "cpu_backend.h"
#include "forwarding_backend.h"
#include "mixtrain/sdk/plugin.h"

namespace {

using namespace mixtrain;

class CpuWithoutLayerNorm final : public test::ForwardingBackend {
 public:
  CpuWithoutLayerNorm(const sdk::Options&, const sdk::PluginContext&)
      : ForwardingBackend(std::make_shared<backend_cpu::CpuBackend>(1)) {}

  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::LayerNormFacet::kName ? nullptr : in_->find_facet(name);
  }
};

std::vector<sdk::ComponentInfo> components() {
  return {{sdk::ComponentKind::backend,
           "test_cpu_without_layer_norm",
           "test backend: the CPU backend (one thread) without the layer_norm facet",
           {},
           &sdk::make_component<CpuWithoutLayerNorm>}};
}

}  // namespace

MIXTRAIN_PLUGIN("test_cpu_without_layer_norm", "1.0.0", components)
