// A device tensor's bytes copied to the host, named: checkpoints, a replan's round trip of the
// training state, the replicas' agreement check. Waits for the copy. Internal to the core.
#pragma once

#include <memory>
#include <string>

#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::core {

struct ModelParameter;

sdk::HostTensor to_host(sdk::DeviceBackend& b, const std::string& name, sdk::TensorView v);
// The same as FP32 whatever v's dtype (a frozen parameter's one copy, widened exactly): weights
// leave in FP32 on every path. fp16, bf16 and fp8 widen on the host (no device memory); other
// dtypes through a device cast.
sdk::HostTensor to_host_fp32(const std::shared_ptr<sdk::DeviceBackend>& b, const std::string& name,
                             sdk::TensorView v);
// A parameter's stored weights as FP32, whatever their storage (an NF4 weight decoded):
// parameter_to_host_fp32 (graph/layer.h), named `name`.
sdk::HostTensor parameter_to_host(const std::shared_ptr<sdk::DeviceBackend>& b,
                                  const std::string& name, const ModelParameter& p);

}  // namespace mixtrain::core
