// layernorm over the last dimension.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "mixtrain/core/graph/layer.h"

namespace mixtrain::core {

// Per-row normalisation with FP32 statistics; gamma/beta are FP32 and never weight-decayed.
// Precision-sensitive: the host keeps its output and input gradient in FP32 too.
class LayerNormLayer final : public Layer {
 public:
  LayerNormLayer(std::string name, std::int64_t features, float eps);
  std::vector<BackendNeed> backend_needs(sdk::DType input) const override;
  void allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t max_rows) override;
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;
  void init_parameters(std::uint64_t seed) override;

 private:
  float eps_;
  Tensor mean_, rstd_;
};

}  // namespace mixtrain::core
