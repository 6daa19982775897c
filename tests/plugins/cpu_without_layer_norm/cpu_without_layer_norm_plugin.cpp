// A backend that cannot run every FP32 model: the CPU backend with its layer-norm facet hidden,
// as a GPU backend built without a kernel would be. Models without a layernorm run exactly as on
// "cpu"; one with a layernorm must stop at plan time naming the node (`mixtrain calibrate`'s
// bad-input test, tests/integration/test_calibrate.cpp).
#include <memory>
#include <string_view>

#include "cpu_backend.h"
#include "mixtrain/sdk/plugin.h"

namespace {

using namespace mixtrain;

class CpuWithoutLayerNorm final : public sdk::DeviceBackend {
 public:
  CpuWithoutLayerNorm(const sdk::Options&, const sdk::PluginContext&)
      : in_(std::make_unique<backend_cpu::CpuBackend>(1)) {}

  sdk::BackendCapabilities capabilities() const override { return in_->capabilities(); }
  void* allocate(std::size_t bytes) override { return in_->allocate(bytes); }
  void deallocate(void* p) noexcept override { in_->deallocate(p); }
  sdk::MemoryStats memory_stats() const override { return in_->memory_stats(); }
  void copy_from_host(sdk::TensorView d, const void* s) override { in_->copy_from_host(d, s); }
  void copy_to_host(void* d, sdk::TensorView s) override { in_->copy_to_host(d, s); }
  void copy(sdk::TensorView d, sdk::TensorView s) override { in_->copy(d, s); }
  void synchronize() override { in_->synchronize(); }
  void cast(sdk::TensorView s, sdk::TensorView d, const sdk::CastArgs& a) override {
    in_->cast(s, d, a);
  }
  void fill(sdk::TensorView x, float v) override { in_->fill(x, v); }
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::LayerNormFacet::kName ? nullptr : in_->find_facet(name);
  }

 private:
  std::unique_ptr<backend_cpu::CpuBackend> in_;
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
