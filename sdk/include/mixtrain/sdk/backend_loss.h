// LossFacet: losses over logits, computed in FP32.
//
// Contract
// - A backend offers it as find_facet("loss") (nullptr: the backend has none).
// - supports(op, dtypes) answers for {logits} (labels are int32), without running anything.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a new
//   version only appends methods).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class LossOp { softmax_cross_entropy };
MIXTRAIN_SDK_API std::string_view op_name(LossOp op) noexcept;

class MIXTRAIN_SDK_API LossFacet : public Facet {
 public:
  static constexpr std::uint32_t kVersion = 1;
  static constexpr std::string_view kName = "loss";
  std::string_view name() const final { return kName; }
  std::uint32_t version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(LossOp op, std::span<const DType> dtypes) const;

  // logits [rows, classes], labels int32 [rows]. loss (fp32 [1]) = mean cross-entropy of the
  // softmax in FP32; correct (int32 [1], optional) = rows whose argmax equals the label;
  // dlogits (optional) = (softmax - onehot) * grad_scale / rows. A label outside [0, classes)
  // raises BackendError.
  virtual void softmax_cross_entropy(TensorView logits, TensorView labels, float grad_scale,
                                     TensorView loss, TensorView correct, TensorView dlogits) = 0;

 protected:
  ~LossFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
