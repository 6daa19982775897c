// FP8 operand scaling for one GEMM-like product of an op (a linear's matmul, a convolution): each
// operand is cast to the dtype and scale its slot "<node>.<gemm>.<role>" gets from the precision
// policy, with saturation and a fused amax that goes back to the policy.
//
// Contract
// - Delayed scaling: the amax of each cast stays on the device until the model reads every
//   scaler's at once (Model::flush_operand_amaxes, after the step's found_inf read: one host wait
//   per step, whatever the number of FP8 layers), maxed over the micro-batches of one optimizer
//   step. The amaxes live in the model's table (bind_amaxes, which Model::allocate calls before
//   any cast).
// - Current scaling: the amax is measured and read before the scale is asked for (one host wait
//   per operand).
// - scale() keeps the last scaled copy per role; last() views it again (the backward reuses the
//   forward's input and weight casts).
// - A weight is cast once per optimizer step: the micro-batches after the first (index > 0 since
//   begin_micro_batch(0)) reuse the copy of the same source tensor as it is, scale and amax
//   included, since neither the weight nor its scale changes within a step (Transformer Engine
//   keeps a weight's FP8 copy across micro-batches likewise). record_amaxes(), once per step
//   before the optimizer runs, ends that reuse. Asking for statistics casts anew. `stats`,
//   when given, receives what the cast saturated and flushed to zero (diagnostics; reads the
//   tensors back).
// - Non-owning: the policy outlives the op; the backend is the op's.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mixtrain/core/graph/layer.h"
#include "mixtrain/core/graph/tensor.h"

namespace mixtrain::core {

class OperandScaler {
 public:
  OperandScaler(const std::string& node, const std::string& gemm);
  void set_policy(sdk::PrecisionPolicy* policy) { policy_ = policy; }
  bool active() const { return policy_ != nullptr; }
  void begin_micro_batch(std::int64_t index) {
    micro_batch_ = index;
    if (index == 0) weight_source_ = nullptr;  // a new step: the weights may have changed
  }

  sdk::GemmOperand scale(const std::shared_ptr<sdk::DeviceBackend>& backend, sdk::TensorView src,
                         sdk::OperandRole role,
                         std::vector<Layer::ScaledOperandStats>* stats = nullptr);
  // The last scaled copy of `role`, seen as `shape`.
  sdk::GemmOperand last(sdk::OperandRole role, sdk::Shape shape) const;
  // Delayed scaling, after the step's casts: the device slot of the three amaxes (input,
  // weight, grad_output; fp32 [3]) in the model's table, bound once the model has allocated it.
  void bind_amaxes(sdk::TensorView three);
  sdk::TensorView amaxes() const { return amax_view_; }
  bool amaxes_pending() const { return amax_pending_[0] || amax_pending_[1] || amax_pending_[2]; }
  // Appends the pending ones of `host` (the three as read from amaxes()) to `out`, in role order;
  // record_amaxes then hands as many of `values` to the policy, in the same order (between the
  // two a reduction may change them: data parallel, the max over the ranks), and returns how
  // many it took. Called on every scaler once per step, pending or not: it ends the step's
  // weight-copy reuse.
  void pending_amaxes(const float* host, std::vector<float>& out) const;
  std::size_t record_amaxes(std::span<const float> values);

 private:
  struct ScaledOperand {
    Tensor data;  // fp8 copy of the operand
    float scale_inv = 1.0f;
  };
  sdk::PrecisionPolicy* policy_ = nullptr;
  std::vector<sdk::OperandSlot> slots_;  // per role: input, weight, grad_output
  ScaledOperand copies_[3];
  sdk::TensorView amax_view_;  // fp32 [3] in the model's table: the last cast's amax per role
  bool amax_pending_[3] = {false, false, false};
  std::int64_t micro_batch_ = 0;
  // The weight this step's copy was cast from (its data and size); null: none cast this step.
  const void* weight_source_ = nullptr;
  std::int64_t weight_numel_ = 0;
};

}  // namespace mixtrain::core
