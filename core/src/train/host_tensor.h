// A device tensor's bytes copied to the host, named: checkpoints, a replan's round trip of the
// training state, the replicas' agreement check. Waits for the copy. Internal to the core.
#pragma once

#include <string>

#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::core {

sdk::HostTensor to_host(sdk::DeviceBackend& b, const std::string& name, sdk::TensorView v);

}  // namespace mixtrain::core
