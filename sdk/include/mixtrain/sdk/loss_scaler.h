// LossScaler: owns the loss scale.
//
// Contract: each step the host multiplies the loss gradient by scale(), runs backward, unscales
// the FP32 gradients by 1/scale() while checking for inf/NaN, then calls update(found_inf).
// update() decides whether the optimizer step is applied and adjusts the scale for the next
// step. save_state()/load_state() round-trip everything update() depends on, so a resumed run
// continues with the same scale trajectory. The decision that stands for a step is that of one
// update() after its state: with the gated update (docs/architecture.md, "The gated update") the
// host may ask first, before the check is read, save_state(), update(false), and, when the
// gradients were not finite after all, load_state() of that state and update(true). So update()
// keeps no effect outside its saved state (a counter of calls, a log line of a change it made)
// that a load_state() would not undo. update(true) skips the step: the host skips a step whose
// gradients are not finite whatever update() answers, and warns once of a scaler that applied one.
// scale() is a finite number above 0; any other is the scaler's PluginError. Not thread-safe.
#pragma once

#include "mixtrain/sdk/export.h"

#include "mixtrain/sdk/component.h"
#include "mixtrain/sdk/component_state.h"

namespace mixtrain::sdk {

struct ScalerDecision {
  bool apply_step = true;    // false: skip the optimizer step (non-finite gradients)
  float scale_before = 1.0f;
  float scale_after = 1.0f;
};

class MIXTRAIN_SDK_API LossScaler : public Component {
 public:
  ~LossScaler() override;
  virtual float scale() const = 0;
  virtual ScalerDecision update(bool found_inf) = 0;
  virtual ComponentState save_state() const = 0;
  virtual void load_state(const ComponentState& state) = 0;
};

}  // namespace mixtrain::sdk
