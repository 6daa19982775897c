// SgdOptimizer ("sgd"): torch.optim.SGD — momentum, dampening, Nesterov, L2 weight decay —
// through DeviceBackend::sgd_update.
//
// Contract: one "momentum_buffer" slot per parameter, only when momentum > 0. The first applied
// step initialises the buffer to the gradient (PyTorch's first_step rule), later ones use the
// momentum recurrence; a resumed run that restores the slots and the step count continues
// exactly. Parameters with weight_decay = false are updated with decay 0. Nesterov requires
// momentum > 0 and dampening = 0, checked at construction.
#pragma once

#include "backend_optimizer.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain::optimizers {

class SgdOptimizer final : public BackendOptimizer {
 public:
  static sdk::OptionSchema option_schema();

  SgdOptimizer(const sdk::Options& options, const sdk::PluginContext& context);

 private:
  void update(std::span<const sdk::ParamTensors> group, bool decayed, float lr, float grad_scale,
              const sdk::UpdateGate* gate) override;

  float momentum_;
  float dampening_;
  float weight_decay_;
  bool nesterov_;
};

}  // namespace mixtrain::optimizers
