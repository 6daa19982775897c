// LionOptimizer ("lion"): Lion (Chen et al. 2023, "Symbolic Discovery of Optimization
// Algorithms"), the sign of an interpolation of momentum and gradient, with decoupled weight
// decay. Per parameter, with g = grad * grad_scale:
//   c = beta1 * m + (1 - beta1) * g
//   p = p * (1 - lr * weight_decay) - lr * sign(c)     (no decay where weight_decay = false)
//   m = beta2 * m + (1 - beta2) * g
// then the working copy is refreshed from p (backend.cast).
//
// Contract
// - bind() allocates, per parameter, the FP32 momentum m (zeroed; state tensor
//   "<param>.momentum") and an FP32 scratch c of the same size (not state: rebuilt every step).
// - bind() checks that the backend's foreach facet has the ops step() uses
//   (foreach_mul_scalar, foreach_add, foreach_sign on fp32), else BackendError before the first
//   step. step() then runs all of it on the device, one foreach call per phase over every
//   parameter, plus a copy per parameter and the working copy's cast.
// - The host checkpoints the FP32 masters itself ("param/<name>"); this optimizer saves its
//   momentum through state_tensors() and the applied-step count through save_state() (version 1).
//   On resume the host restores both after bind() and before the first step.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mixtrain/sdk/optimizer.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/plugin.h"

namespace mixtrain_samples {

class LionOptimizer final : public mixtrain::sdk::Optimizer {
 public:
  static constexpr std::int64_t kStateVersion = 1;
  static mixtrain::sdk::OptionSchema option_schema();

  LionOptimizer(const mixtrain::sdk::Options& options, const mixtrain::sdk::PluginContext& context);
  ~LionOptimizer() override;

  double base_lr() const override { return lr_; }
  void bind(mixtrain::sdk::DeviceBackend& backend,
            std::span<const mixtrain::sdk::Parameter> params) override;
  void step(mixtrain::sdk::DeviceBackend& backend, std::span<const mixtrain::sdk::Parameter> params,
            const mixtrain::sdk::StepContext& ctx) override;
  std::vector<mixtrain::sdk::NamedTensorView> state_tensors() const override;
  mixtrain::sdk::ComponentState save_state() const override;
  void load_state(const mixtrain::sdk::ComponentState& state) override;

  std::int64_t applied_steps() const { return applied_steps_; }

 private:
  struct Slots {
    std::string name;                    // the parameter's
    mixtrain::sdk::TensorView momentum;  // m, fp32, saved in checkpoints
    mixtrain::sdk::TensorView update;    // c, then sign(c); fp32 scratch
  };
  void release() noexcept;

  mixtrain::sdk::Logger logger_;
  double lr_;
  float beta1_;
  float beta2_;
  float weight_decay_;
  mixtrain::sdk::DeviceBackend* backend_ = nullptr;  // the one bind() allocated through
  std::vector<Slots> slots_;                         // per bound parameter, in order
  mixtrain::sdk::ForeachFacet* ops_ = nullptr;       // the backend's, checked by bind()
  // Per phase, the tensors of every parameter (views; built once by bind()).
  std::vector<mixtrain::sdk::TensorView> momenta_, updates_, grads_, masters_, decayed_masters_;
  std::int64_t applied_steps_ = 0;
};

}  // namespace mixtrain_samples
