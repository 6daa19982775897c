// PrecisionPolicy: which dtype each tensor of each layer uses.
//
// Contract
// - adapt_to() is called once, before any plan(), with the capabilities of the backend the run
//   uses, so a policy such as `auto` can choose formats the hardware runs natively.
// - plan() is called once per layer when the model is built and must be deterministic. The host
//   applies the user's [[precision.override]] entries on top of the returned plan, then checks
//   every GEMM dtype against the backend's capabilities.
// - Accumulation, master weights, gradients of weights and optimizer state are always FP32; a
//   policy chooses only the low-precision copies and storage.
// - Policies that scale GEMM operands (FP8) return uses_scaled_operands() = true and keep one
//   scaling slot per (layer, role). The host calls operand_scaling() before casting an operand,
//   record_amax() with the amax the backend measured during that cast, and on_step_end() after
//   each step (applied or skipped). A policy whose scale must come from the tensor being cast
//   (current scaling) returns wants_current_amax() = true: the host then measures the operand's
//   amax and calls record_amax() before operand_scaling() as well. State round-trips through save_state()/load_state().
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

namespace mixtrain::sdk {

struct LayerDescription {
  std::string name;  // unique, from the config ("fc1", "head")
  std::string type;  // "linear", "layernorm", "relu", "gelu", "softmax_cross_entropy"
  std::int64_t in_features = 0;
  std::int64_t out_features = 0;
  bool has_gemm = false;
};

struct LayerPrecision {
  DType weight = DType::fp32;           // working copy of the weights
  DType gemm_input = DType::fp32;       // A/B operands of the layer's GEMMs (tf32: rounded fp32)
  DType activation = DType::fp32;       // storage of the layer's output activation
  DType activation_grad = DType::fp32;  // storage of the gradient w.r.t. the layer's input
  bool fp32_pinned = false;             // statistics / softmax / loss: everything fp32
};

enum class OperandRole { input, weight, grad_output };
std::string_view operand_role_name(OperandRole r) noexcept;

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
  virtual LayerPrecision plan(const LayerDescription& layer) const = 0;
  // True for formats whose narrow exponent range needs a loss scaler (fp16); `mixtrain check`
  // warns when such a policy runs with scaler.type = "none".
  virtual bool needs_loss_scaling() const = 0;

  virtual bool uses_scaled_operands() const { return false; }
  virtual bool wants_current_amax() const { return false; }
  virtual OperandScaling operand_scaling(const std::string& /*layer*/, OperandRole /*role*/) {
    return {};
  }
  virtual void record_amax(const std::string& /*layer*/, OperandRole /*role*/, float /*amax*/) {}
  virtual void on_step_end(bool /*applied*/) {}

  virtual ComponentState save_state() const { return {}; }
  virtual void load_state(const ComponentState& /*state*/) {}
};

}  // namespace mixtrain::sdk
