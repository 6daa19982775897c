// PrecisionPolicy: which dtype each tensor of each op uses.
//
// Contract
// - adapt_to() is called once, before any plan(), with the capabilities of the backend the run
//   uses, so a policy such as `auto` can choose formats the hardware runs natively.
// - plan() is called once per op (node) when the model is built, with the op's description (kind,
//   GEMMs with their operand roles, precision sensitivity: op_description.h), and must be
//   deterministic. gemm_input applies to every GEMM of the op. The host then, in this order:
//   pins every dtype of a precision-sensitive op to FP32 (the op's own trait, so a policy keeps
//   no deny-list of op kinds), applies the user's [[precision.override]] entries, and checks
//   every GEMM dtype against the backend's capabilities.
// - Accumulation, master weights, gradients of weights and optimizer state are always FP32; a
//   policy chooses only the low-precision copies and storage.
// - Policies that scale GEMM operands (FP8) return uses_scaled_operands() = true and keep one
//   scaling slot per OperandSlot, i.e. per (node, GEMM, role), named "<node>.<gemm>.<role>".
//   The host calls operand_scaling() before casting an operand, record_amax() with the amax the
//   backend measured during that cast, and on_step_end() after each step (applied or skipped). A
//   policy whose scale must come from the tensor being cast (current scaling) returns
//   wants_current_amax() = true: the host then measures the operand's amax and calls
//   record_amax() before operand_scaling() as well. State round-trips through
//   save_state()/load_state(); a policy that renames its slots bumps its state version and
//   migrates or refuses older states.
// - Not thread-safe; one trainer drives one policy.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <string>
#include <vector>

#include "mixtrain/sdk/component.h"
#include "mixtrain/sdk/component_state.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/dtype.h"
#include "mixtrain/sdk/op_description.h"

namespace mixtrain::sdk {

struct OpPrecision {
  DType weight = DType::fp32;           // working copy of the weights
  DType gemm_input = DType::fp32;       // A/B operands of the op's GEMMs (tf32: rounded fp32)
  DType activation = DType::fp32;       // storage of the op's output activation
  DType activation_grad = DType::fp32;  // storage of the gradient w.r.t. the op's input
};

struct OperandScaling {
  DType dtype = DType::fp32;  // fp8_e4m3 or fp8_e5m2 for scaled operands
  float scale = 1.0f;         // multiply before casting
  float scale_inv = 1.0f;     // handed to the GEMM
};

class MIXTRAIN_SDK_API PrecisionPolicy : public Component {
 public:
  ~PrecisionPolicy() override;
  virtual void adapt_to(const BackendCapabilities& /*capabilities*/) {}
  // The policy whose plan this one applies when it chooses one in adapt_to() (`auto` ->
  // "bf16-mixed"); empty for a policy that is itself. The host records it in summary.json.
  virtual std::string resolved_name() const { return {}; }
  virtual OpPrecision plan(const OpDescription& op) const = 0;
  // True for formats whose narrow exponent range needs a loss scaler (fp16); `mixtrain check`
  // warns when such a policy runs with scaler.type = "none".
  virtual bool needs_loss_scaling() const = 0;

  virtual bool uses_scaled_operands() const { return false; }
  virtual bool wants_current_amax() const { return false; }
  virtual OperandScaling operand_scaling(const OperandSlot& /*slot*/) { return {}; }
  virtual void record_amax(const OperandSlot& /*slot*/, float /*amax*/) {}
  virtual void on_step_end(bool /*applied*/) {}

  virtual ComponentState save_state() const { return {}; }
  virtual void load_state(const ComponentState& /*state*/) {}
};

}  // namespace mixtrain::sdk
