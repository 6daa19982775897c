// GradientCheckFacet: the mixed-precision gradient checks — unscale and look for inf/NaN, with
// the gradient norm on the same pass — and the diagnostic search for a non-finite tensor.
//
// Contract
// - A backend offers it as find_facet("gradient_check") (nullptr: none).
// - supports(op, dtypes) answers for the dtypes of the call's tensors (listed per op below)
//   without running anything. Reductions are FP32 or wider.
// - Every method returns a host value and so synchronises; a training step waits here once.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/op_signatures.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class GradientCheckOp {
  unscale_and_check_finite,       // {grads}
  unscale_check_and_sum_squares,  // {grads}
  first_nonfinite,                // {tensors}
};
MIXTRAIN_SDK_API std::string_view op_name(GradientCheckOp op) noexcept;
MIXTRAIN_SDK_API OpSignature op_signature(GradientCheckOp op) noexcept;

class MIXTRAIN_SDK_API GradientCheckFacet : public Facet {
 public:
  using Op = GradientCheckOp;
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "gradient_check";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(GradientCheckOp op, std::span<const DType> dtypes) const;

  // One pass over every fp32 gradient: g *= inv_scale, and report whether any element of any
  // tensor was inf or NaN (before or after scaling): returns found_inf. The single host sync of
  // a step.
  virtual bool unscale_and_check_finite(std::span<const TensorView> grads, float inv_scale) = 0;
  // unscale_and_check_finite, then Σ g² (in double) over the unscaled gradients, with one wait
  // for both: the step that clips or logs the gradient norm still waits once. sum_of_squares is
  // not finite when found_inf is.
  struct GradientCheck {
    bool found_inf = false;
    double sum_of_squares = 0.0;
  };
  virtual GradientCheck unscale_check_and_sum_squares(std::span<const TensorView> grads,
                                                      float inv_scale) = 0;
  // Index of the first tensor holding an inf/NaN, or -1 (storage dtypes). For diagnostics.
  virtual int first_nonfinite(std::span<const TensorView> tensors) = 0;

 protected:
  ~GradientCheckFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
