// Out-of-line anchors: each polymorphic SDK type gets its vtable and type_info here, once.
#include <cstdlib>

#include "mixtrain/sdk/checkpoint_format.h"
#include "mixtrain/sdk/communicator.h"
#include "mixtrain/sdk/component.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/logging.h"
#include "mixtrain/sdk/loss_scaler.h"
#include "mixtrain/sdk/optimizer.h"
#include "mixtrain/sdk/plugin.h"
#include "mixtrain/sdk/precision_policy.h"

namespace mixtrain::sdk {

Component::~Component() = default;
DeviceBackend::~DeviceBackend() = default;
PrecisionPolicy::~PrecisionPolicy() = default;
LossScaler::~LossScaler() = default;
Optimizer::~Optimizer() = default;
CheckpointFormat::~CheckpointFormat() = default;
Communicator::~Communicator() = default;
void Communicator::abort(int exit_code) noexcept {
  std::_Exit(exit_code);
}
CommunicationHandle::~CommunicationHandle() = default;
LogSink::~LogSink() = default;

std::string_view component_kind_name(ComponentKind k) noexcept {
  switch (k) {
    case ComponentKind::backend: return "backend";
    case ComponentKind::policy: return "policy";
    case ComponentKind::scaler: return "scaler";
    case ComponentKind::optimizer: return "optimizer";
    case ComponentKind::checkpoint_format: return "checkpoint_format";
    case ComponentKind::communicator: return "communicator";
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  return "?";
}

std::string_view operand_role_name(OperandRole r) noexcept {
  switch (r) {
    case OperandRole::input: return "input";
    case OperandRole::weight: return "weight";
    case OperandRole::grad_output: return "grad_output";
  }
  return "?";
}

}  // namespace mixtrain::sdk
