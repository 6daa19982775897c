// layernorm over the last dimension.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "mixtrain/core/graph/layer.h"

namespace mixtrain::core {

// Per-row normalisation with FP32 statistics; gamma/beta are FP32 and never weight-decayed.
// Precision-sensitive: the host keeps its input gradient in FP32 too, and its output, unless every
// reader reads it as a bf16 GEMM operand (GPT's ln_1 / ln_2 / ln_f before their linears), which
// would round it to bf16 on every read: then the output is stored in bf16, rounded once here
// (precision/planning.h; the same bits those readers read, without their casts). Where its input
// is read by other ops as well (GPT's residual stream), its backward adds its input gradient into
// the FP32 sum itself (layer norm 1.1's layernorm_backward_accumulate, layer.h) where the
// backend offers it, fusion is on (set_fusion) and the backward has no visitor: no scratch, no
// axpy. The sum is the same bits as the axpy's.
// Add + layer norm: when its input is a two-input add's output, the add runs this layer norm in
// its own pass (AddLayer::fuse_one_reader, forward_with_sum: layer norm 1.2's
// layernorm_add_forward). The add still writes its sum for its other readers and this op's
// backward; this op's output is written then, at the add's step (the memory plan's
// output_written_by_input), and forward() does nothing. The same bits as the two ops apart: the
// sum is normalised as stored. Unfused, with the reason logged once, where the backend lacks the
// op, and under set_fusion(false) (the non-finite replay).
class LayerNormLayer final : public Layer {
 public:
  LayerNormLayer(std::string name, std::int64_t features, float eps);
  std::vector<BackendNeed> backend_needs(sdk::DType input) const override;
  void allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t max_rows) override;
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;
  void init_parameters(std::uint64_t seed) override;
  void choose_kernels(sdk::DeviceBackend& backend) override;
  void set_fusion(bool on) override;
  // The add that produces its input will run it in its pass (add + layer norm).
  void defer_into_input();
  // Fused: sum = a + b (the add's output, rows of it), then this layer norm of it, in one pass;
  // false (nothing written) when the pair cannot run fused now: fusion off, or the backend lacks
  // layernorm_add_forward for these dtypes. forward() then runs as usual.
  bool forward_with_sum(sdk::TensorView a, sdk::TensorView b, sdk::TensorView sum,
                        std::int64_t rows);
  bool can_accumulate_input_gradient(std::size_t k) const override {
    return k == 0 && fusion_on_ && accumulate_offered_;
  }

 private:
  void update_fusion();  // fused() and output_written_by_input from what decides them
  // Why the add + layer norm pair runs apart, once per reason (`why`: what the backend lacks).
  void log_add_unfused_once(const std::string& why) const;

  bool fusion_on_ = true;
  bool accumulate_offered_ = false;  // the backend has layernorm_backward_accumulate
  bool into_input_ = false;          // an add runs it in its pass (defer_into_input)
  bool add_offered_ = false;         // the backend has layernorm_add_forward (choose_kernels)
  bool written_by_add_ = false;      // the last forward_with_sum wrote the output forward() owes
  float eps_;
  Tensor mean_, rstd_;
};

}  // namespace mixtrain::core
