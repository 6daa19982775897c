// Optimizer: updates FP32 master weights from FP32, unscaled gradients.
//
// Contract
// - bind() is called once with every trainable parameter before the first step; the optimizer
//   allocates its FP32 state through the backend (and frees it in its destructor — the host keeps
//   the backend alive longer than the optimizer). A session that never trains (eval, predict,
//   sample, export --initial) binds an empty span and never calls step().
// - step() applies one update to every parameter. `lr` comes from the host's schedule;
//   `grad_scale` is the clipping coefficient to multiply gradients by (1 when not clipping).
//   After the update each parameter's `working` copy (when present) holds the new weights in its
//   low-precision dtype.
// - state_tensors() exposes the per-parameter slots (named "<param>.<slot>", each name its own:
//   the host refuses two of one name when it binds) so the host can save and restore them;
//   save_state()/load_state() carry scalars such as the step count.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mixtrain/sdk/component.h"
#include "mixtrain/sdk/component_state.h"

#include "mixtrain/sdk/backend_optimizer_updates.h"  // ParamTensors
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/facet_list.h"

namespace mixtrain::sdk {

struct Parameter {
  std::string name;         // "fc1.weight"
  ParamTensors tensors;     // master, grad, working (state slots are the optimizer's)
  bool weight_decay = true; // false for biases and norm parameters
};

struct NamedTensorView {
  std::string name;
  TensorView view;
};

struct StepContext {
  float lr = 0.0f;
  float grad_scale = 1.0f;
};

class MIXTRAIN_SDK_API Optimizer : public Component {
 public:
  ~Optimizer() override;
  virtual double base_lr() const = 0;  // the configured lr, the schedule's peak
  virtual void bind(DeviceBackend& backend, std::span<const Parameter> params) = 0;
  virtual void step(DeviceBackend& backend, std::span<const Parameter> params,
                    const StepContext& ctx) = 0;
  virtual std::vector<NamedTensorView> state_tensors() const = 0;
  virtual ComponentState save_state() const = 0;
  virtual void load_state(const ComponentState& state) = 0;
};

}  // namespace mixtrain::sdk
