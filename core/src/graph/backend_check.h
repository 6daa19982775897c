// check_backend: asks the backend, before anything runs, for every facet op each node will call
// under its precision plan, for the loss and for the gradient accumulation; throws
// sdk::ConfigError at the first node it cannot run, naming the node, the op, the dtypes and the
// backend, with the node's config location. Internal to the core (Model::check_backend).
#pragma once

#include "mixtrain/core/graph/memory_plan.h"
#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::core {

void check_backend(const GraphPlan& plan, const Ops& ops, sdk::DeviceBackend& backend);

}  // namespace mixtrain::core
