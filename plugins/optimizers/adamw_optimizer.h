// AdamWOptimizer ("adamw"): torch.optim.AdamW — Adam with decoupled weight decay and bias
// correction — through DeviceBackend::adamw_update.
//
// Contract: slots "exp_avg" and "exp_avg_sq" per parameter, zero-initialised. Bias correction
// uses the 1-based count of applied steps, saved and restored with the optimizer state, so a
// resumed run continues exactly. Decay is multiplied by lr (p *= 1 - lr*wd) and skipped for
// parameters with weight_decay = false. Option ranges follow PyTorch's checks.
#pragma once

#include "backend_optimizer.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain::optimizers {

class AdamWOptimizer final : public BackendOptimizer {
 public:
  static sdk::OptionSchema option_schema();

  AdamWOptimizer(const sdk::Options& options, const sdk::PluginContext& context);

 private:
  void update(std::span<const sdk::ParamTensors> group, bool decayed, float lr, float grad_scale,
              const sdk::UpdateGate* gate) override;

  float beta1_;
  float beta2_;
  float eps_;
  float weight_decay_;
};

}  // namespace mixtrain::optimizers
