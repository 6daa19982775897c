// LossScaler: owns the loss scale.
//
// Contract: each step the host multiplies the loss gradient by scale(), runs backward, unscales
// the FP32 gradients by 1/scale() while checking for inf/NaN, then calls update(found_inf) exactly
// once. update() decides whether the optimizer step is applied and adjusts the scale for the next
// step. save_state()/load_state() round-trip everything update() depends on, so a resumed run
// continues with the same scale trajectory. Not thread-safe.
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
