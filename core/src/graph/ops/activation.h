// The element-wise activations relu and gelu (tanh approximation), any shape.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "mixtrain/core/graph/layer.h"

namespace mixtrain::core {

class ActivationLayer final : public Layer {
 public:
  ActivationLayer(std::string name, sdk::Activation act, std::int64_t features);
  std::vector<BackendNeed> backend_needs(sdk::DType input) const override;
  sdk::Activation activation() const { return act_; }
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;

 private:
  friend class LinearLayer;  // sets fused_ when it takes over the forward
  sdk::Activation act_;
  bool fused_ = false;
};

}  // namespace mixtrain::core
