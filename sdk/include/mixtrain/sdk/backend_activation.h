// ActivationFacet: the element-wise kernels of a layer — bias gradient, activation forward and
// backward, and axpy (the sum every gradient accumulation and residual fallback is built from).
//
// Contract
// - A backend offers it as find_facet("activation") (nullptr: none).
// - supports(op, dtypes) answers for the dtypes of the call's tensors (listed per op below)
//   without running anything. Math runs in FP32 whatever the storage dtype; bias_grad's sum is
//   FP32. Shapes are [rows, cols] (a view of rank > 2 is folded to [rows(), cols()]).
// - Nothing here synchronises: every op is enqueued on the backend's stream.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/backend_gemm.h"  // Activation
#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/op_signatures.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class ActivationOp {
  bias_grad,            // {dy, dbias}
  activation_forward,   // {x, y}
  activation_backward,  // {x, dy, dx}
  axpy,                 // {x, y}
};
MIXTRAIN_SDK_API std::string_view op_name(ActivationOp op) noexcept;
MIXTRAIN_SDK_API OpSignature op_signature(ActivationOp op) noexcept;

class MIXTRAIN_SDK_API ActivationFacet : public Facet {
 public:
  using Op = ActivationOp;
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "activation";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(ActivationOp op, std::span<const DType> dtypes) const;

  // dbias[n] (fp32) = (accumulate ? dbias : 0) + sum over rows of dy[rows, n]
  virtual void bias_grad(TensorView dy, TensorView dbias, bool accumulate) = 0;
  // y = act(x); x and y may alias (same dtype).
  virtual void activation_forward(Activation act, TensorView x, TensorView y) = 0;
  // dx = dy * act'(x), with x the pre-activation input; dx may alias dy.
  virtual void activation_backward(Activation act, TensorView x, TensorView dy, TensorView dx) = 0;
  // y += alpha * x; x any storage dtype, y fp32.
  virtual void axpy(float alpha, TensorView x, TensorView y) = 0;

 protected:
  ~ActivationFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
