// Descriptor of libmixtrain_optimizers: sgd and adamw over the backend's fused kernels.
#include "mixtrain/sdk/plugin.h"

#include "adamw_optimizer.h"
#include "sgd_optimizer.h"

namespace {

std::vector<mixtrain::sdk::ComponentInfo> optimizer_components() {
  using namespace mixtrain;
  using sdk::ComponentKind;
  return {
      {ComponentKind::optimizer, "sgd", "SGD with momentum, Nesterov and weight decay (PyTorch)",
       optimizers::SgdOptimizer::option_schema(), &sdk::make_component<optimizers::SgdOptimizer>},
      {ComponentKind::optimizer, "adamw", "AdamW with decoupled weight decay (PyTorch)",
       optimizers::AdamWOptimizer::option_schema(),
       &sdk::make_component<optimizers::AdamWOptimizer>},
  };
}

}  // namespace

MIXTRAIN_PLUGIN("optimizers", "0.1.0", optimizer_components)
