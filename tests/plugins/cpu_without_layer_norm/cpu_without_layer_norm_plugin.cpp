// Backends that lack one facet: the CPU backend with that facet hidden, as a GPU backend built
// without a kernel would be.
// - test_cpu_without_layer_norm: models without a layernorm run exactly as on "cpu"; one with a
//   layernorm must stop at plan time naming the node (`mixtrain calibrate`'s bad-input test,
//   tests/integration/test_calibrate.cpp).
// - test_cpu_without_image_input: byte images are decoded on the host instead, with the same
//   values (tests/integration/test_cli_images.cpp).
#include <memory>
#include <string_view>

#include "cpu_backend.h"
#include "forwarding_backend.h"
#include "mixtrain/sdk/backend_image_input.h"
#include "mixtrain/sdk/plugin.h"

namespace {

using namespace mixtrain;

template <class Hidden>
class CpuWithout final : public test::ForwardingBackend {
 public:
  CpuWithout(const sdk::Options&, const sdk::PluginContext&)
      : ForwardingBackend(std::make_shared<backend_cpu::CpuBackend>(1)) {}

  sdk::Facet* find_facet(std::string_view name) override {
    return name == Hidden::kName ? nullptr : in_->find_facet(name);
  }
};

std::vector<sdk::ComponentInfo> components() {
  return {{sdk::ComponentKind::backend,
           "test_cpu_without_layer_norm",
           "test backend: the CPU backend (one thread) without the layer_norm facet",
           {},
           &sdk::make_component<CpuWithout<sdk::LayerNormFacet>>},
          {sdk::ComponentKind::backend,
           "test_cpu_without_image_input",
           "test backend: the CPU backend (one thread) without the image_input facet",
           {},
           &sdk::make_component<CpuWithout<sdk::ImageInputFacet>>}};
}

}  // namespace

MIXTRAIN_PLUGIN("test_cpu_without_layer_norm", "1.0.0", components)
