// ResidualFacet: the residual join y = Σ xs (then ReLU) in one pass, and (1.1) its backward: every
// input's gradient from one read of dy.
//
// Contract
// - A backend offers it as find_facet("residual") (nullptr: none). It is optional: a host that
//   finds no residual facet, or one whose supports() answers no for an input, joins with
//   ActivationFacet's axpy (and activation_forward for the ReLU) instead, with the same sum in
//   FP32 but one more rounding when y is not fp32.
// - supports(add, {x, y}) answers for one input x and the output y (ask once per input), without
//   running anything.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods). 1.1 appended add_backward; a host asks for it only where
//   its facet is 1.1 or later (introduced_in) and otherwise writes each input's gradient with
//   ActivationFacet's activation_backward (relu) or a copy / cast.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/op_signatures.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class ResidualOp {
  add,  // {x, y}: each input's dtype with y's
  // 1.1
  add_backward,  // {dy, dx}: dy's dtype with each gradient's
};
MIXTRAIN_SDK_API std::string_view op_name(ResidualOp op) noexcept;
MIXTRAIN_SDK_API OpSignature op_signature(ResidualOp op) noexcept;
constexpr std::uint16_t introduced_in(ResidualOp op) noexcept {
  return op == ResidualOp::add_backward ? 1 : 0;
}

class MIXTRAIN_SDK_API ResidualFacet : public Facet {
 public:
  using Op = ResidualOp;
  static constexpr FacetVersion kVersion{1, 1};
  static constexpr std::string_view kName = "residual";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(ResidualOp op, std::span<const DType> dtypes) const;

  // y = Σ xs, then max(0, ·) when `relu`: summed in FP32 and rounded once into y's dtype. xs: two
  // or more tensors of y's numel in any storage dtype; y may be one of them (same dtype).
  virtual void add(std::span<const TensorView> xs, bool relu, TensorView y) = 0;

  // --- 1.1 --------------------------------------------------------------------------------
  // Every input's gradient of y = Σ xs (then ReLU), in one pass over dy: dx_k = dy, masked to 0
  // where y is not positive when `relu` (relu'(s) = [s > 0] = [y > 0]), rounded once into dx_k's
  // dtype. dy and y: tensors of one numel in any storage dtype (y is read only when `relu`; it may
  // be empty otherwise). dxs: one or more tensors of that numel in any storage dtype; an empty one
  // is skipped; one may be dy itself (same view, same dtype: masked in place); the others are
  // disjoint from dy, y and each other. Why one pass: a residual stream's gradient fans out to
  // the block and the shortcut, and writing both from one read of dy and y saves a read of each
  // per extra input.
  virtual void add_backward(TensorView dy, TensorView y, bool relu,
                            std::span<const TensorView> dxs) = 0;

 protected:
  ~ResidualFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
