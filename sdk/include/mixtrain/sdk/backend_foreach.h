// ForeachFacet: the foreach ops an optimizer plugin composes its update from without leaving the
// device (torch._foreach_*_ semantics, in place on `self`).
//
// Contract
// - A backend offers it as find_facet("foreach") (nullptr: none).
// - Every list is fp32, the lists have equal length, and the i-th tensors of all lists have equal
//   numel; a violation raises BackendError. An empty list is a no-op. Math in FP32.
// - NaN propagates through every op (clamp and sign included: clamp(NaN) and sign(NaN) are NaN,
//   so a broken update stays visible to the non-finite check).
// - supports(op, dtypes): one entry per list argument, in order; answers without running
//   anything. Nothing here synchronises.
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

enum class ForeachOp {
  foreach_mul_scalar,  // {self}
  foreach_mul,         // {self, other}
  foreach_add_scalar,  // {self}
  foreach_add,         // {self, other}
  foreach_addcmul,     // {self, t1, t2}
  foreach_sqrt,        // {self}
  foreach_sign,        // {self}
  foreach_lerp,        // {self, end}
  foreach_clamp,       // {self}
};
MIXTRAIN_SDK_API std::string_view op_name(ForeachOp op) noexcept;
MIXTRAIN_SDK_API OpSignature op_signature(ForeachOp op) noexcept;

class MIXTRAIN_SDK_API ForeachFacet : public Facet {
 public:
  using Op = ForeachOp;
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "foreach";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(ForeachOp op, std::span<const DType> dtypes) const;

  // For each i, in place on self[i]:
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
  ~ForeachFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
