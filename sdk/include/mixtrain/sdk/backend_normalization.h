// NormalizationFacet: per-row normalisation with FP32 statistics.
//
// Contract
// - A backend offers it through DeviceBackend::normalization_facet() (nullptr: none).
// - supports(op, dtypes) answers for {x} (forward: the input and output dtype; backward: x and
//   dy share it), without running anything. Statistics, gamma and beta are fp32.
// - version() reports the kVersion this facet was compiled against (do not override it).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class NormalizationOp { layernorm_forward, layernorm_backward };
MIXTRAIN_SDK_API std::string_view op_name(NormalizationOp op) noexcept;

class MIXTRAIN_SDK_API NormalizationFacet {
 public:
  static constexpr std::uint32_t kVersion = 1;
  static constexpr std::string_view kName = "normalization";
  virtual std::uint32_t version() const { return kVersion; }
  virtual bool supports(NormalizationOp op, std::span<const DType> dtypes) const = 0;

  // x, y [rows, n]: y = (x - mean) * rstd * gamma + beta per row; mean, rstd: fp32 [rows]
  // written for backward.
  virtual void layernorm_forward(TensorView x, TensorView gamma, TensorView beta, float eps,
                                 TensorView y, TensorView mean, TensorView rstd) = 0;
  // dx (overwritten); dgamma, dbeta fp32 [n] accumulated when `accumulate`, else overwritten.
  virtual void layernorm_backward(TensorView dy, TensorView x, TensorView gamma, TensorView mean,
                                  TensorView rstd, TensorView dx, TensorView dgamma,
                                  TensorView dbeta, bool accumulate) = 0;

 protected:
  virtual ~NormalizationFacet();  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
