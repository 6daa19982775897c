// GatedStepFacet: an optimizer whose update the host can queue before it knows whether the step
// applies. The device skips the update when the step's gradient check found an inf or NaN and
// clips it from the norm that check wrote (GradientCheckFacet 1.1's GradientStatus), so the host
// reads the check's outcome while the update runs instead of draining the device for it first
// (docs/architecture.md, "One training step").
//
// Contract
// - An optimizer offers it by deriving from it beside Optimizer; the host finds it with
//   dynamic_cast on the optimizer (an older optimizer never derives from it, so adding it changed
//   no core interface). Versioned as a facet (facet.h: name, major.minor, the same step rules, its
//   own record in the ABI guard); the host calls only what the optimizer's minor declares.
// - can_gate(): after bind(), whether the bound backend runs this optimizer's gated update on
//   every bound parameter (its optimizer facet is 1.1 or later and supports the gated kernel).
//   false: the host waits for the check and calls step().
// - step_gated(backend, params, ctx) queues the update step() would make with ctx.lr, gated on
//   ctx.status (an int32 [4] GradientStatus the backend's check wrote earlier in stream order):
//   nothing is written when its found_inf is set; else the gradients are scaled by
//   clip_coefficient(Σ g², ctx.max_norm) (support/gradient_clipping.h; 1 when max_norm is 0).
//   It changes none of the optimizer's own state on the host.
// - settle(applied): the host calls it once after every step_gated, before any other call of
//   the optimizer, with whether the device applied that update (found_inf was 0). true advances
//   the optimizer's host state as step() would have (its applied-step count); false leaves it.
// - Errors: step_gated throws what step() throws (BackendError from the kernels), and
//   std::logic_error when called before bind() or twice without a settle() between.
// - Ownership: the facet is the optimizer itself; it lives as long as the optimizer.
#pragma once

#include "mixtrain/sdk/export.h"

#include <span>
#include <string_view>

#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/optimizer.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

struct GatedStepContext {
  float lr = 0.0f;
  double max_norm = 0.0;  // > 0: global-norm clipping at this norm
  TensorView status;      // int32 [4], the GradientStatus the update reads
};

class MIXTRAIN_SDK_API GatedStepFacet : public Facet {
 public:
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "gated_step";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }

  virtual bool can_gate() const = 0;
  virtual void step_gated(DeviceBackend& backend, std::span<const Parameter> params,
                          const GatedStepContext& ctx) = 0;
  virtual void settle(bool applied) = 0;

 protected:
  ~GatedStepFacet() override;  // not owned through the facet: the optimizer is
};

}  // namespace mixtrain::sdk
