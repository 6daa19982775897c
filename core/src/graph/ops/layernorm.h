// layernorm over the last dimension.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "mixtrain/core/graph/layer.h"

namespace mixtrain::core {

// Per-row normalisation with FP32 statistics; gamma/beta are FP32 and never weight-decayed.
// Precision-sensitive: the host keeps its output and input gradient in FP32 too. Where its input
// is read by other ops as well (GPT's residual stream), its backward adds its input gradient into
// the FP32 sum itself (layer norm 1.1's layernorm_backward_accumulate, layer.h) where the
// backend offers it, fusion is on (set_fusion) and the backward has no visitor: no scratch, no
// axpy. The sum is the same bits as the axpy's.
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
  void set_fusion(bool on) override { fusion_on_ = on; }
  bool can_accumulate_input_gradient(std::size_t k) const override {
    return k == 0 && fusion_on_ && accumulate_offered_;
  }

 private:
  bool fusion_on_ = true;
  bool accumulate_offered_ = false;  // the backend has layernorm_backward_accumulate
  float eps_;
  Tensor mean_, rstd_;
};

}  // namespace mixtrain::core
