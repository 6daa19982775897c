// A backend whose gemm facet has no block-scaled ops: the CPU backend with its gemm facet behind a
// forwarder that keeps the 1.2 defaults (supports() false, the calls a BackendError), as a backend
// built before the block-scaled ops, or a GPU without them, would be. A block-scaled policy on it
// must stop at plan time naming the node (tests/integration/test_block_scaled_policies.cpp).
#include <memory>
#include <span>
#include <string_view>

#include "cpu_backend.h"
#include "forwarding_backend.h"
#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/plugin.h"

namespace {

using namespace mixtrain;

class GemmWithoutBlocks final : public sdk::GemmFacet {
 public:
  explicit GemmWithoutBlocks(sdk::GemmFacet* in) : in_(in) {}
  bool supports(sdk::GemmOp op, std::span<const sdk::DType> dtypes) const override {
    return op != sdk::GemmOp::quantize_block_scaled && op != sdk::GemmOp::gemm_block_scaled &&
           in_->supports(op, dtypes);
  }
  void gemm(const sdk::GemmArgs& args) override { in_->gemm(args); }
  void gemm_strided_batched(const sdk::GemmBatchedArgs& args) override {
    in_->gemm_strided_batched(args);
  }
  void gemm_grouped(std::span<const sdk::GemmArgs> group) override { in_->gemm_grouped(group); }
  // supports() forwards gemm_gradient's answer (gemm 1.5), so the call is forwarded too.
  void gemm_gradient(const sdk::GemmGradientArgs& args) override { in_->gemm_gradient(args); }

 private:
  sdk::GemmFacet* in_;
};

class CpuWithoutBlockScaling final : public test::ForwardingBackend {
 public:
  CpuWithoutBlockScaling(const sdk::Options&, const sdk::PluginContext&)
      : ForwardingBackend(std::make_shared<backend_cpu::CpuBackend>(1)),
        gemm_(static_cast<sdk::GemmFacet*>(in_->find_facet(sdk::GemmFacet::kName))) {}

  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::GemmFacet::kName ? &gemm_ : in_->find_facet(name);
  }

 private:
  GemmWithoutBlocks gemm_;
};

std::vector<sdk::ComponentInfo> components() {
  return {{sdk::ComponentKind::backend,
           "test_cpu_without_block_scaling",
           "test backend: the CPU backend (one thread) whose gemm facet lacks the block-scaled ops",
           {},
           &sdk::make_component<CpuWithoutBlockScaling>}};
}

}  // namespace

MIXTRAIN_PLUGIN("test_cpu_without_block_scaling", "1.0.0", components)
