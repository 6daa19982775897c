// BatchNormFacet: batch norm per channel over channels-last activations (BN + ReLU fused when
// asked), training and evaluation forwards and the backward, with FP32 statistics.
//
// Contract
// - A backend offers it as find_facet("batch_norm") (nullptr: none).
// - supports(op, dtypes) answers for {x} (forward: the input and output dtype; backward: x and
//   dy share it; fp32, bf16 or fp16), without running anything. Statistics, gamma and beta are
//   fp32 whatever the activations' dtype, as for layer norm.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a new
//   version only appends methods).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class BatchNormOp {
  batchnorm_forward_training,   // {x}
  batchnorm_forward_inference,  // {x}
  batchnorm_backward,           // {x}
};
MIXTRAIN_SDK_API std::string_view op_name(BatchNormOp op) noexcept;

// Batch norm over channels-last activations: x, y [rows, C] with rows = N·H·W for images
// [N, H, W, C] (and rows = N for [N, C]); statistics are per channel over all rows.
// y = (x − mean) / sqrt(var + eps) · gamma + beta, then max(0, ·) when `relu` (BN + ReLU fused:
// the backward masks dy where y is 0). gamma and beta are fp32 [C], or both empty when the norm
// is not affine (1 and 0).
struct BatchNormShape {
  std::int64_t rows = 1, channels = 1;
  float eps = 1e-5f;
  bool relu = false;
};

class MIXTRAIN_SDK_API BatchNormFacet : public Facet {
 public:
  static constexpr std::uint32_t kVersion = 1;
  static constexpr std::string_view kName = "batch_norm";
  std::string_view name() const final { return kName; }
  std::uint32_t version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(BatchNormOp op, std::span<const DType> dtypes) const;

  // Bytes of the workspace batch norm's training forward leaves for its backward (what its ReLU
  // mask needs: the CPU backend keeps 2·C floats; 0 when the backend needs none). The caller
  // allocates it and passes it to both calls; a workspace sized for a larger batch also serves.
  virtual std::size_t batchnorm_workspace_bytes(const BatchNormShape& shape, DType x) const = 0;
  // Training: normalises with this batch's statistics and writes them, fp32 [C]: save_mean and
  // save_var (the biased variance, what backward reads). When running_mean / running_var (fp32
  // [C]) are given they move towards the batch's: r = (1 − momentum)·r + momentum·s, with the
  // unbiased variance (× rows / (rows − 1)) for running_var, as PyTorch's BatchNorm2d.
  virtual void batchnorm_forward_training(TensorView x, TensorView gamma, TensorView beta,
                                          const BatchNormShape& shape, float momentum, TensorView y,
                                          TensorView save_mean, TensorView save_var,
                                          TensorView running_mean, TensorView running_var,
                                          TensorView workspace) = 0;
  // Evaluation: normalises with the running statistics (fp32 [C]); nothing is updated.
  virtual void batchnorm_forward_inference(TensorView x, TensorView gamma, TensorView beta,
                                           TensorView running_mean, TensorView running_var,
                                           const BatchNormShape& shape, TensorView y) = 0;
  // dx (overwritten, x's dtype) from dy, x, the saved statistics and (relu) y or the workspace;
  // dgamma, dbeta fp32 [C] accumulated when `accumulate`, else overwritten (empty when not
  // affine).
  virtual void batchnorm_backward(TensorView dy, TensorView x, TensorView y, TensorView gamma,
                                  TensorView save_mean, TensorView save_var,
                                  const BatchNormShape& shape, TensorView workspace, TensorView dx,
                                  TensorView dgamma, TensorView dbeta, bool accumulate) = 0;

 protected:
  ~BatchNormFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
