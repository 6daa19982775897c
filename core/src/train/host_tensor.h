// A device tensor's bytes copied to the host, named: checkpoints, a replan's round trip of the
// training state, the replicas' agreement check. Waits for the copy. Internal to the core.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "checkpoint/staged_state.h"

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
// For an fp32 tensor, its first element that is not finite, as "nan at element 12" / "inf at
// element 3"; nullopt when all are finite or the tensor is of another dtype.
std::optional<std::string> first_nonfinite_fp32(const sdk::HostTensor& t);
std::optional<std::string> first_nonfinite_fp32(sdk::DType dtype, std::span<const std::byte> bytes);

// The same copies staged for a checkpoint (checkpoint/staged_state.h): read when a format asks,
// into the buffer it gives. The backend and the parameter must outlive the staged tensor.
StagedTensor staged_view(const std::shared_ptr<sdk::DeviceBackend>& b, const std::string& name,
                         sdk::TensorView v);
StagedTensor staged_parameter(const std::shared_ptr<sdk::DeviceBackend>& b, const std::string& name,
                              const ModelParameter& p);
// Bytes already on the host, handed out as they are.
StagedTensor staged_host(sdk::HostTensor t);

}  // namespace mixtrain::core
