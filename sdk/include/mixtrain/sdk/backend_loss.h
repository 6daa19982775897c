// LossFacet: losses over logits, computed in FP32.
//
// Contract
// - A backend offers it as find_facet("loss") (nullptr: the backend has none).
// - supports(op, dtypes) answers for {logits} (labels are int32), without running anything.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods). 2.0 gave softmax_cross_entropy its label_smoothing
//   argument: a changed signature, hence a new major; a backend of major 1 is refused at plan
//   time, naming both versions.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/op_signatures.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class LossOp { softmax_cross_entropy };
MIXTRAIN_SDK_API std::string_view op_name(LossOp op) noexcept;
MIXTRAIN_SDK_API OpSignature op_signature(LossOp op) noexcept;

class MIXTRAIN_SDK_API LossFacet : public Facet {
 public:
  using Op = LossOp;
  static constexpr FacetVersion kVersion{2, 0};
  static constexpr std::string_view kName = "loss";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(LossOp op, std::span<const DType> dtypes) const;

  // logits [rows, classes], labels int32 [rows], label_smoothing ε in [0, 1]. With p the softmax
  // in FP32 (log-sum-exp and sums in double) and the smoothed target t = (1 - ε)·onehot + ε /
  // classes: loss (fp32 [1]) = the mean over rows of -Σ_j t_j log p_j = (1 - ε)·CE + ε·mean_j
  // (-log p_j), torch.nn.CrossEntropyLoss(label_smoothing=ε); correct (int32 [1], optional) =
  // rows whose argmax (the lowest index among equal maxima) equals the label; dlogits (optional)
  // = (p - t) * grad_scale / rows. ε = 0 is plain cross-entropy. A label outside [0, classes) or
  // an ε outside [0, 1] (NaN included) raises BackendError.
  virtual void softmax_cross_entropy(TensorView logits, TensorView labels, float grad_scale,
                                     float label_smoothing, TensorView loss, TensorView correct,
                                     TensorView dlogits) = 0;

 protected:
  ~LossFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
