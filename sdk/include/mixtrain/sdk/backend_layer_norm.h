// LayerNormFacet: layer norm per row, forward and backward, with FP32 statistics.
//
// Contract
// - A backend offers it as find_facet("layer_norm") (nullptr: none).
// - supports(op, dtypes) answers for {x} (forward: the input and output dtype; backward: x and
//   dy share it; fp32, bf16 or fp16), without running anything. Statistics, gamma and beta are
//   fp32 whatever the activations' dtype: the mixed-precision recipes keep norm statistics in
//   FP32, and so does every backend.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods). 1.1 appended layernorm_backward_accumulate, 1.2
//   layernorm_add_forward; each is refused by default (supports() false, the call a
//   BackendError), and a host asks for it only where the facet is that version or later.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/op_signatures.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class LayerNormOp {
  layernorm_forward,   // {x}
  layernorm_backward,  // {x}
  // 1.1
  layernorm_backward_accumulate,  // {x}
  // 1.2
  layernorm_add_forward,  // {a, b, sum, y}
};
MIXTRAIN_SDK_API std::string_view op_name(LayerNormOp op) noexcept;
constexpr std::uint16_t introduced_in(LayerNormOp op) noexcept {
  switch (op) {
    case LayerNormOp::layernorm_backward_accumulate:
      return 1;
    case LayerNormOp::layernorm_add_forward:
      return 2;
    default:
      return 0;
  }
}
MIXTRAIN_SDK_API OpSignature op_signature(LayerNormOp op) noexcept;

// layernorm_add_forward's arguments (1.2): the residual join and the layer norm that reads it.
struct LayerNormAddArgs {
  TensorView a, b;   // [rows, n], any storage dtype
  TensorView sum;    // [rows, n]: a + b in FP32, rounded once into its dtype; may be a or b
  TensorView gamma;  // fp32 [n], or empty (1)
  TensorView beta;   // fp32 [n], or empty (0)
  float eps = 1e-5f;
  TensorView y;     // [rows, n], any storage dtype; apart from a, b and sum
  TensorView mean;  // fp32 [rows], written
  TensorView rstd;  // fp32 [rows], written
};

class MIXTRAIN_SDK_API LayerNormFacet : public Facet {
 public:
  using Op = LayerNormOp;
  static constexpr FacetVersion kVersion{1, 2};
  static constexpr std::string_view kName = "layer_norm";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(LayerNormOp op, std::span<const DType> dtypes) const;

  // x, y [rows, n]: y = (x - mean) * rstd * gamma + beta per row; mean, rstd: fp32 [rows]
  // written for backward.
  virtual void layernorm_forward(TensorView x, TensorView gamma, TensorView beta, float eps,
                                 TensorView y, TensorView mean, TensorView rstd) = 0;
  // dx (overwritten); dgamma, dbeta fp32 [n] accumulated when `accumulate`, else overwritten.
  // Either may be empty (a frozen parameter's): that sum is not computed.
  virtual void layernorm_backward(TensorView dy, TensorView x, TensorView gamma, TensorView mean,
                                  TensorView rstd, TensorView dx, TensorView dgamma,
                                  TensorView dbeta, bool accumulate) = 0;

  // --- 1.1 ---------------------------------------------------------------------------------------
  // layernorm_backward that adds the input gradient into an fp32 dx instead of overwriting it:
  // dx += (the gradient in FP32), never rounded into a narrower dtype first. The host's sum of a
  // tensor read by several ops (the residual stream, read by a layer norm and by the next add)
  // then needs no scratch and no separate pass adding it. dx must be fp32 and overlap neither dy
  // nor x; dgamma, dbeta and `accumulate` are layernorm_backward's. Default: BackendError, and
  // supports() false; a backend offers it by overriding both (and a facet that forwards
  // supports() to another one forwards this call too).
  virtual void layernorm_backward_accumulate(TensorView dy, TensorView x, TensorView gamma,
                                             TensorView mean, TensorView rstd, TensorView dx,
                                             TensorView dgamma, TensorView dbeta, bool accumulate);

  // --- 1.2 ---------------------------------------------------------------------------------------
  // The residual add and the layer norm that reads its sum, in one pass: sum = a + b (FP32, one
  // rounding, what ResidualFacet::add writes), then layernorm_forward of the sum *as stored* into
  // y, mean and rstd: the same bits as the two ops one after the other, with one read of the sum
  // less. Why: in a pre-norm transformer every residual add is read at once by a layer norm, and
  // both are memory-bound passes over the residual stream. supports({a, b, sum, y}); default:
  // BackendError, and supports() false (the host then runs the add and the layer norm apart).
  virtual void layernorm_add_forward(const LayerNormAddArgs& args);

 protected:
  ~LayerNormFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
