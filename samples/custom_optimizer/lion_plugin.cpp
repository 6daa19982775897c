// Descriptor of libmixtrain_lion.so: one optimizer component, "lion".
#include "lion_optimizer.h"
#include "mixtrain/sdk/plugin.h"

namespace {

std::vector<mixtrain::sdk::ComponentInfo> components() {
  using mixtrain_samples::LionOptimizer;
  return {{mixtrain::sdk::ComponentKind::optimizer, "lion",
           "Lion: signed interpolation of momentum and gradient, decoupled weight decay (on the "
           "device, through the foreach facet)",
           LionOptimizer::option_schema(), &mixtrain::sdk::make_component<LionOptimizer>}};
}

}  // namespace

MIXTRAIN_PLUGIN("lion", "1.0.0", components)
