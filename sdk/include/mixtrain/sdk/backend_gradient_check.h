// GradientCheckFacet: the mixed-precision gradient checks — unscale and look for inf/NaN, with
// the gradient norm on the same pass — and the diagnostic search for a non-finite tensor.
//
// Contract
// - A backend offers it as find_facet("gradient_check") (nullptr: none).
// - supports(op, dtypes) answers for the dtypes of the call's tensors (listed per op below)
//   without running anything. Reductions are FP32 or wider.
// - Every 1.0 method returns a host value and so synchronises. 1.1 appended the check without a
//   drain: queue_unscale_check leaves its outcome on the device (GradientStatus) for a gated
//   optimizer update (OptimizerFacet 1.1) to read, and queued_check_result waits for that
//   outcome only, not for the update queued after it. A host asks for them only where its facet
//   is 1.1 or later (introduced_in), and otherwise waits on unscale_and_check_finite. 1.2
//   appended count_underflow, the tally of the underflow diagnostic, so that pass reads no
//   gradient back to the host.
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
  // 1.1
  queue_unscale_check,  // {grads}
  // 1.2
  count_underflow,  // {values}
};
MIXTRAIN_SDK_API std::string_view op_name(GradientCheckOp op) noexcept;
MIXTRAIN_SDK_API OpSignature op_signature(GradientCheckOp op) noexcept;
constexpr std::uint16_t introduced_in(GradientCheckOp op) noexcept {
  return op == GradientCheckOp::count_underflow       ? 2
         : op == GradientCheckOp::queue_unscale_check ? 1
                                                      : 0;
}

// What queue_unscale_check leaves on the device: a `status` tensor of int32 [kWords] holds these
// 16 bytes. found_inf != 0: the step must not apply (an inf or NaN in the gradients; a backend
// may also set it when an input error it defers, such as a label out of range, makes the
// gradients meaningless, and queued_check_result then raises that error). sum_of_squares: Σ g²
// of the unscaled gradients when asked for, else 0.
struct GradientStatus {
  static constexpr std::int64_t kWords = 4;
  double sum_of_squares = 0.0;
  std::int32_t found_inf = 0;
  std::int32_t reserved = 0;  // the backend's; a host ignores it
};
static_assert(sizeof(GradientStatus) == 4 * GradientStatus::kWords);

// What count_underflow reports of a tensor: its elements that are not zero (a NaN among them), and
// those of them whose magnitude is at most the threshold.
struct UnderflowTally {
  std::int64_t nonzero = 0;
  std::int64_t flushed = 0;
};

class MIXTRAIN_SDK_API GradientCheckFacet : public Facet {
 public:
  using Op = GradientCheckOp;
  static constexpr FacetVersion kVersion{1, 2};
  static constexpr std::string_view kName = "gradient_check";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(GradientCheckOp op, std::span<const DType> dtypes) const;

  // One pass over every fp32 gradient: g *= inv_scale, and report whether any element of any
  // tensor was inf or NaN (before or after scaling): returns found_inf. The single host sync of
  // a step. The grads of this call and of the two below are apart from each other (a tensor
  // listed twice would be scaled twice, by two workers at once): BackendError otherwise.
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

  // --- 1.1 --------------------------------------------------------------------------------
  // The unscale and check of unscale_and_check_finite (and Σ g² when `sum_squares`), queued: it
  // writes their outcome to `status` (int32 [GradientStatus::kWords], device memory the caller
  // owns, laid out as GradientStatus), where a gated optimizer update reads it, and queues the
  // status's copy to the host. Returns without waiting. Why: the host can queue the optimizer's
  // update behind the check and learn the outcome while the update runs, so the device never
  // drains for it. BackendError for a status of another dtype or size.
  virtual void queue_unscale_check(std::span<const TensorView> grads, float inv_scale,
                                   bool sum_squares, TensorView status) = 0;
  // The outcome of the last queue_unscale_check, as unscale_check_and_sum_squares reports it
  // (sum_of_squares 0 when it was not asked for). Waits for that check's copy only, not for what
  // was queued after it. std::logic_error when no check is queued (each is read once).
  virtual GradientCheck queued_check_result() = 0;

  // --- 1.2 --------------------------------------------------------------------------------
  // Counts the fp32 `values`' elements that are not zero, and those of them with |x| <= threshold
  // (the underflow diagnostic: the gradient values a narrower dtype would store as zero, the
  // threshold being that dtype's largest such magnitude). Returns the counts, and so
  // synchronises; exact whatever the order of the sums. Why: the diagnostic's pass counts every
  // activation gradient of a step, which read back to the host would cross the bus.
  // BackendError for values that are not fp32 or a threshold that is negative or not finite.
  virtual UnderflowTally count_underflow(TensorView values, float threshold) = 0;

 protected:
  ~GradientCheckFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
