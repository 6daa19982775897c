// ElementwiseFacet: element-wise and reduction kernels, the mixed-precision gradient checks, and
// the foreach ops an optimizer plugin composes its update from without leaving the device.
//
// Contract
// - A backend offers it through DeviceBackend::elementwise_facet() (nullptr: none).
// - supports(op, dtypes) answers for the dtypes of the call's tensors (documented per op below)
//   without running anything. Math runs in FP32 whatever the storage dtype; reductions are FP32
//   or wider. Shapes are [rows, cols] (a view of rank > 2 is folded to [rows(), cols()]).
// - Only the methods returning host values synchronise (unscale_and_check_finite,
//   unscale_check_and_sum_squares, first_nonfinite).
// - Foreach ops (torch._foreach_*_ semantics, in place on `self`): every list is fp32, the lists
//   have equal length, and the i-th tensors of all lists have equal numel. An empty list is a
//   no-op. NaN propagates through every op (clamp and sign included: clamp(NaN) and sign(NaN)
//   are NaN, so a broken update stays visible to the non-finite check). dtypes for supports():
//   one entry per list argument, in order.
// - version() reports the kVersion this facet was compiled against (do not override it).
//   Version 2 added add (the residual join, with an optional fused ReLU).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/backend_gemm.h"  // Activation
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class ElementwiseOp {
  bias_grad,                      // {dy, dbias}
  activation_forward,             // {x, y}
  activation_backward,            // {x, dy, dx}
  axpy,                           // {x, y}
  unscale_and_check_finite,       // {grads}
  unscale_check_and_sum_squares,  // {grads}
  first_nonfinite,                // {tensors}
  foreach_mul_scalar,             // {self}
  foreach_mul,                    // {self, other}
  foreach_add_scalar,             // {self}
  foreach_add,                    // {self, other}
  foreach_addcmul,                // {self, t1, t2}
  foreach_sqrt,                   // {self}
  foreach_sign,                   // {self}
  foreach_lerp,                   // {self, end}
  foreach_clamp,                  // {self}
  add,                            // {x, y}: each input's dtype with y's (version 2)
};
MIXTRAIN_SDK_API std::string_view op_name(ElementwiseOp op) noexcept;

class MIXTRAIN_SDK_API ElementwiseFacet {
 public:
  static constexpr std::uint32_t kVersion = 2;
  static constexpr std::string_view kName = "elementwise";
  virtual std::uint32_t version() const { return kVersion; }
  virtual bool supports(ElementwiseOp op, std::span<const DType> dtypes) const = 0;

  // --- layer kernels -----------------------------------------------------------------------------
  // dbias[n] (fp32) = (accumulate ? dbias : 0) + sum over rows of dy[rows, n]
  virtual void bias_grad(TensorView dy, TensorView dbias, bool accumulate) = 0;
  // y = act(x); x and y may alias (same dtype).
  virtual void activation_forward(Activation act, TensorView x, TensorView y) = 0;
  // dx = dy * act'(x), with x the pre-activation input; dx may alias dy.
  virtual void activation_backward(Activation act, TensorView x, TensorView dy, TensorView dx) = 0;
  // y += alpha * x; x any storage dtype, y fp32.
  virtual void axpy(float alpha, TensorView x, TensorView y) = 0;
  // y = Σ xs, then max(0, ·) when `relu`: a residual join in one pass, summed in FP32 and rounded
  // once into y's dtype. xs: two or more tensors of y's numel in any storage dtype; y may be one
  // of them (same dtype). Optional: a backend that has it says so in supports(add, {x, y}) for
  // each input; this default throws BackendError, and callers fall back to axpy + activation.
  virtual void add(std::span<const TensorView> xs, bool relu, TensorView y);

  // --- mixed-precision gradient checks
  // ------------------------------------------------------------- One pass over every fp32
  // gradient: g *= inv_scale, and report whether any element of any tensor was inf or NaN (before
  // or after scaling): returns found_inf. The single host sync of a step.
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

  // --- foreach ops: for each i, in place on self[i] ----------------------------------------------
  virtual void foreach_mul_scalar(std::span<const TensorView> self, float scalar) = 0;  // x *= s
  virtual void foreach_mul(std::span<const TensorView> self,
                           std::span<const TensorView> other) = 0;                      // x *= o
  virtual void foreach_add_scalar(std::span<const TensorView> self, float scalar) = 0;  // x += s
  virtual void foreach_add(std::span<const TensorView> self, std::span<const TensorView> other,
                           float alpha = 1.0f) = 0;  // x += alpha * o
  virtual void foreach_addcmul(std::span<const TensorView> self, std::span<const TensorView> t1,
                               std::span<const TensorView> t2,
                               float value = 1.0f) = 0;             // x += value * t1 * t2
  virtual void foreach_sqrt(std::span<const TensorView> self) = 0;  // x = sqrt(x)
  virtual void foreach_sign(std::span<const TensorView> self) = 0;  // x = -1, 0 (±0 kept) or 1
  virtual void foreach_lerp(std::span<const TensorView> self, std::span<const TensorView> end,
                            float weight) = 0;  // x += weight * (end - x)
  virtual void foreach_clamp(std::span<const TensorView> self, float lo,
                             float hi) = 0;  // x = min(max(x, lo), hi); lo <= hi

 protected:
  virtual ~ElementwiseFacet();  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
