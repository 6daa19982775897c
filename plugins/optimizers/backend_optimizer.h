// BackendOptimizer: the shared half of optimizers whose update is one of the backend's fused
// kernels (SGD, AdamW).
//
// Contract
// - bind() first checks that the backend's optimizer facet runs this optimizer's kernel on every
//   parameter's dtypes (BackendError naming the kernel, the dtypes and the backend otherwise: the
//   run stops before the first step); kernels() is that facet afterwards.
// - bind() allocates one FP32 slot per parameter per declared slot name with backend.allocate,
//   zeroes it with backend.fill, and remembers the backend: the destructor (or a later bind())
//   frees the slots through it, which the host guarantees outlives the optimizer.
// - grouped() splits the parameters into those with weight decay and those without, each as
//   ParamTensors carrying the slots, so a subclass calls its kernel once per non-empty group.
// - The applied-step count (step() calls that reached the kernels) is the optimizer's scalar
//   state: it drives AdamW's bias correction and SGD's first-step momentum initialisation, and
//   round-trips through save_state()/load_state() (version 1). It lies in [0, kMaxAppliedSteps]:
//   load_state() rejects a count outside it and counting stops at its top, so AdamW's 1-based
//   step (count + 1) never overflows.
// - state_tensors() names slots "<param>.<slot>" in parameter order, then slot order.
// - Gated steps (sdk/optimizer_gated_step.h): every BackendOptimizer offers them; can_gate() is
//   true when bind() found the backend's optimizer facet at 1.1 or later supporting the gated
//   kernel on every parameter's dtypes. step_gated() runs the same per-group update as step()
//   through that kernel and counts nothing; settle(true) counts the applied step. step() or
//   step_gated() while a gated step awaits its settle() is std::logic_error.
// - A subclass writes one thing: update(), its kernel call for one group of parameters.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mixtrain/sdk/backend_call_observer.h"
#include "mixtrain/sdk/backend_optimizer_updates.h"
#include "mixtrain/sdk/optimizer.h"
#include "mixtrain/sdk/optimizer_gated_step.h"
#include "mixtrain/sdk/plugin.h"

namespace mixtrain::optimizers {

class BackendOptimizer : public sdk::Optimizer, public sdk::GatedStepFacet {
 public:
  static constexpr std::int64_t kStateVersion = 1;
  static constexpr std::size_t kMaxSlots = 2;  // ParamTensors has state1 and state2
  static constexpr std::int64_t kMaxAppliedSteps = INT64_MAX - 1;

  ~BackendOptimizer() override;

  double base_lr() const override { return lr_; }
  void bind(sdk::DeviceBackend& backend, std::span<const sdk::Parameter> params) override;
  std::vector<sdk::NamedTensorView> state_tensors() const override;
  sdk::ComponentState save_state() const override;
  void load_state(const sdk::ComponentState& state) override;

  void step(sdk::DeviceBackend& backend, std::span<const sdk::Parameter> params,
            const sdk::StepContext& ctx) final;

  bool can_gate() const override { return gated_; }
  void step_gated(sdk::DeviceBackend& backend, std::span<const sdk::Parameter> params,
                  const sdk::GatedStepContext& ctx) override;
  void settle(bool applied) override;

  std::int64_t applied_steps() const { return applied_steps_; }

 protected:
  // kernel / gated_kernel: the facet's plain and gated update this optimizer calls.
  BackendOptimizer(std::string component, double lr, std::vector<std::string> slot_names,
                   sdk::OptimizerOp kernel, sdk::OptimizerOp gated_kernel,
                   const sdk::PluginContext& context);
  // One call of the bound backend's optimizer facet (checked by bind()), timed when the backend
  // is profiled: `kernels(gate)->adamw_update(...)`; named after the gated kernel when `gate`.
  sdk::FacetCall<sdk::OptimizerFacet> kernels(const sdk::UpdateGate* gate) const;

  // One group's update: `decayed` says whether its parameters take weight decay; `gate`, when
  // not null, is passed to the gated kernel (grad_scale is then ignored). The applied-step count
  // is that before this update.
  virtual void update(std::span<const sdk::ParamTensors> group, bool decayed, float lr,
                      float grad_scale, const sdk::UpdateGate* gate) = 0;

  sdk::Logger logger_;

 private:
  struct Groups {
    std::vector<sdk::ParamTensors> decayed;
    std::vector<sdk::ParamTensors> undecayed;
  };
  // Checks that `params` are the ones bound, then splits them by Parameter::weight_decay.
  Groups grouped(std::span<const sdk::Parameter> params) const;
  void update_groups(std::span<const sdk::Parameter> params, float lr, float grad_scale,
                     const sdk::UpdateGate* gate);
  void count_applied_step() {
    if (applied_steps_ < kMaxAppliedSteps) ++applied_steps_;
  }
  void release() noexcept;

  std::string component_;
  double lr_;
  std::vector<std::string> slot_names_;
  sdk::OptimizerOp kernel_;
  sdk::OptimizerOp gated_kernel_;
  bool gated_ = false;          // can_gate()
  bool awaits_settle_ = false;  // a step_gated() not yet settled
  sdk::DeviceBackend* backend_ = nullptr;
  sdk::OptimizerFacet* kernels_ = nullptr;
  sdk::CallObserverFacet* observer_ = nullptr;  // the profiler's, when profiled
  std::vector<std::string> param_names_;
  std::vector<std::array<sdk::TensorView, kMaxSlots>> slots_;  // per parameter
  std::int64_t applied_steps_ = 0;
};

}  // namespace mixtrain::optimizers
