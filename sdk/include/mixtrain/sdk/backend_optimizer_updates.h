// OptimizerFacet: fused optimizer updates, one pass over each parameter's tensors.
//
// Contract
// - A backend offers it as find_facet("optimizer") (nullptr: the backend has none). An optimizer
//   plugin that needs it checks in bind(), before the first step; one that does not can compose
//   its update from ForeachFacet's ops instead.
// - supports(op, dtypes) answers for {master, working} (working: the low-precision copy's dtype,
//   fp32 when there is none), without running anything.
// - Updates also refresh `working` copies when present.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods). 1.1 appended the gated updates (sgd_update_gated,
//   adamw_update_gated), which an optimizer asks for only where the facet is 1.1 or later
//   (introduced_in).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/op_signatures.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

struct ParamTensors {
  TensorView master;   // fp32, updated in place
  TensorView grad;     // fp32, already unscaled
  TensorView working;  // low-precision copy refreshed from master after the update; may be empty
  TensorView state1;   // optimizer slot (momentum / exp_avg), fp32; may be empty
  TensorView state2;   // second slot (exp_avg_sq), fp32; may be empty
};

// PyTorch torch.optim.SGD semantics: g = grad*grad_scale + wd*p; buf = first ? g :
// momentum*buf + (1-dampening)*g; g = nesterov ? g + momentum*buf : buf; p -= lr*g.
struct SgdHyper {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = true;   // momentum buffer is initialised to g on the first step
  float grad_scale = 1.0f;  // gradient multiplier (global-norm clipping coefficient)
};

// PyTorch torch.optim.AdamW semantics: p *= 1 - lr*wd; m = b1*m + (1-b1)g; v = b2*v + (1-b2)g²;
// p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).
struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  std::int64_t step = 1;  // 1-based count of applied steps, for bias correction
  float grad_scale = 1.0f;
};

enum class OptimizerOp {
  sgd_update,    // {master, working}
  adamw_update,  // {master, working}
  // 1.1
  sgd_update_gated,    // {master, working}
  adamw_update_gated,  // {master, working}
};
MIXTRAIN_SDK_API std::string_view op_name(OptimizerOp op) noexcept;
MIXTRAIN_SDK_API OpSignature op_signature(OptimizerOp op) noexcept;
constexpr std::uint16_t introduced_in(OptimizerOp op) noexcept {
  return op == OptimizerOp::sgd_update_gated || op == OptimizerOp::adamw_update_gated ? 1 : 0;
}

// What a gated update reads on the device instead of the host's word on the step.
struct UpdateGate {
  // int32 [4]: a GradientStatus (backend_gradient_check.h) written by the same backend's
  // GradientCheckFacet::queue_unscale_check, earlier in stream order.
  TensorView status;
  // > 0: global-norm clipping at this norm, from the status's Σ g² (support/gradient_clipping.h).
  double max_norm = 0.0;
};

class MIXTRAIN_SDK_API OptimizerFacet : public Facet {
 public:
  using Op = OptimizerOp;
  static constexpr FacetVersion kVersion{1, 1};
  static constexpr std::string_view kName = "optimizer";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(OptimizerOp op, std::span<const DType> dtypes) const;

  virtual void sgd_update(const SgdHyper& h, std::span<const ParamTensors> params) = 0;
  virtual void adamw_update(const AdamWHyper& h, std::span<const ParamTensors> params) = 0;

  // --- 1.1 --------------------------------------------------------------------------------
  // sgd_update / adamw_update queued without the host knowing whether the step applies: on the
  // device, nothing at all is written when gate.status holds found_inf != 0; otherwise the
  // update runs with h.grad_scale replaced by clip_coefficient(status Σ g², gate.max_norm)
  // (support/gradient_clipping.h: 1 without clipping), bit for bit the update the host would
  // have made with that coefficient. Why: the host queues it behind the gradient check and reads
  // the check's outcome while it runs (docs/architecture.md, "One training step").
  // BackendError for a status that is not int32 [4].
  virtual void sgd_update_gated(const SgdHyper& h, std::span<const ParamTensors> params,
                                const UpdateGate& gate) = 0;
  virtual void adamw_update_gated(const AdamWHyper& h, std::span<const ParamTensors> params,
                                  const UpdateGate& gate) = 0;

 protected:
  ~OptimizerFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
