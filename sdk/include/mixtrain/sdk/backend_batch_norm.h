// BatchNormFacet: batch norm per channel over channels-last activations (BN + ReLU fused when
// asked), training and evaluation forwards and the backward, with FP32 statistics.
//
// Contract
// - A backend offers it as find_facet("batch_norm") (nullptr: none).
// - supports(op, dtypes) answers for {x} (forward: the input and output dtype; backward: x and
//   dy share it; fp32, bf16 or fp16), without running anything. Statistics, gamma and beta are
//   fp32 whatever the activations' dtype, as for layer norm.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods). 1.1 appended the split ops that synchronized batch norm
//   (`[distributed] batch_norm = "sync"`) runs between its all-reduces: batchnorm_statistics,
//   batchnorm_backward_reduce and batchnorm_backward_elementwise (introduced_in says so); the
//   normalisation with given (global) statistics is 1.0's batchnorm_forward_inference. 1.2
//   appended batchnorm_add_forward: batch norm, a residual add and the ReLU in one pass.
// - Accuracy: the backward's per-channel sums Σg and Σg·(x − mean) (batchnorm_backward's dbeta and
//   dgamma, batchnorm_backward_reduce's outputs) equal a double sum of the stored values to a few
//   fp32 ulps of the result, even when they cancel (Σg a millionth of Σ|g|): accumulate in double
//   or compensate. The conformance kit checks it on such a channel.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/op_signatures.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class BatchNormOp {
  batchnorm_forward_training,   // {x}
  batchnorm_forward_inference,  // {x}
  batchnorm_backward,           // {x}
  // 1.1
  batchnorm_statistics,            // {x}
  batchnorm_backward_reduce,       // {x}; dy and y share it
  batchnorm_backward_elementwise,  // {x}; dy, y and dx share it
  // 1.2
  batchnorm_add_forward,  // {x}; residual and y share it
};
MIXTRAIN_SDK_API std::string_view op_name(BatchNormOp op) noexcept;
MIXTRAIN_SDK_API OpSignature op_signature(BatchNormOp op) noexcept;
constexpr std::uint16_t introduced_in(BatchNormOp op) noexcept {
  return op >= BatchNormOp::batchnorm_add_forward  ? 2
         : op >= BatchNormOp::batchnorm_statistics ? 1
                                                   : 0;
}

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

// 1.2: the end of a ResNet bottleneck, y = max(0, BN(x) + residual), with BN(x) = (x − mean) /
// sqrt(var + eps) · gamma + beta computed in FP32 and never stored: the sum is rounded once into
// y's dtype (one rounding fewer than batch norm, then add). The statistics are this batch's when
// `training` (written to save_mean / save_var and moved into the running ones, exactly as
// batchnorm_forward_training does), the running ones otherwise. shape.relu: the ReLU after the
// add. Nothing is kept for a backward: the add's gradient is g = dy masked where y is not positive
// (the residual's gradient), and batch norm's backward is batchnorm_backward of g with relu off.
struct BatchNormAddArgs {
  TensorView x;            // [rows, C], fp32, bf16 or fp16 storage
  TensorView residual;     // [rows, C], x's dtype; may be y itself
  TensorView gamma, beta;  // fp32 [C] both, or both empty (not affine)
  BatchNormShape shape;
  bool training = true;
  float momentum = 0.1f;  // training: the running statistics' step
  TensorView y;           // [rows, C], x's dtype, disjoint from x
  // Training: written (the batch's mean and biased variance). Evaluation: unused.
  TensorView save_mean, save_var;
  // Training: updated when given. Evaluation: read (required).
  TensorView running_mean, running_var;
};

class MIXTRAIN_SDK_API BatchNormFacet : public Facet {
 public:
  using Op = BatchNormOp;
  static constexpr FacetVersion kVersion{1, 2};
  static constexpr std::string_view kName = "batch_norm";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
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
  // affine; either may be empty beside a given gamma, a frozen parameter's: left unwritten).
  virtual void batchnorm_backward(TensorView dy, TensorView x, TensorView y, TensorView gamma,
                                  TensorView save_mean, TensorView save_var,
                                  const BatchNormShape& shape, TensorView workspace, TensorView dx,
                                  TensorView dgamma, TensorView dbeta, bool accumulate) = 0;

  // --- version 2: synchronized batch norm's split ops ------------------------------------------
  // Why split: with the batch spread over ranks, the statistics and the backward's two sums must
  // be all-reduced between the passes over the data (PyTorch's SyncBatchNorm). The host does the
  // reductions (in double, over [C] vectors); these ops are the passes.
  //
  // This batch's statistics, fp32 [C]: mean and the biased variance, accumulated in FP32 or
  // wider, equal to what batchnorm_forward_training writes to save_mean / save_var for the same
  // x. Nothing else is written; rows >= 1.
  virtual void batchnorm_statistics(TensorView x, const BatchNormShape& shape, TensorView mean,
                                    TensorView var) = 0;
  // The backward's per-channel sums over this batch's rows, fp32 [C], overwritten: with g = dy
  // (masked where y <= 0 when shape.relu: y is then required, else ignored) and x̂ = (x − mean) /
  // sqrt(var + eps), sum_dy = Σ g and sum_dy_xhat = Σ g·x̂. mean and var (fp32 [C]) are the
  // statistics x was normalised with (the global ones). They are also this batch's dbeta and
  // dgamma.
  virtual void batchnorm_backward_reduce(TensorView dy, TensorView x, TensorView y, TensorView mean,
                                         TensorView var, const BatchNormShape& shape,
                                         TensorView sum_dy, TensorView sum_dy_xhat) = 0;
  // dx (overwritten, x's dtype) = gamma·invstd·(g − mean_dy − x̂·mean_dy_xhat), g and x̂ as above,
  // invstd = 1 / sqrt(var + eps); mean_dy and mean_dy_xhat (fp32 [C]) are the sums of
  // batchnorm_backward_reduce over every rank divided by the global row count. gamma empty: 1.
  // With this batch's own statistics and sums it is batchnorm_backward's dx.
  virtual void batchnorm_backward_elementwise(TensorView dy, TensorView x, TensorView y,
                                              TensorView gamma, TensorView mean, TensorView var,
                                              TensorView mean_dy, TensorView mean_dy_xhat,
                                              const BatchNormShape& shape, TensorView dx) = 0;

  // --- 1.2: batch norm + add + ReLU ------------------------------------------------------------
  // Why: at the end of a bottleneck, batch norm's output is read once, by the add; fused, it is
  // never written (a write and a read of the block's widest tensor saved) and the add reads only
  // the residual. Contract at BatchNormAddArgs.
  virtual void batchnorm_add_forward(const BatchNormAddArgs& args) = 0;

 protected:
  ~BatchNormFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
