// The element-wise activations relu and gelu (tanh approximation), any shape.
//
// Contract
// - A linear before it may run it as its GEMM's epilogue (LinearLayer::fuse_reader, linear.h):
//   the forward then does nothing.
// - A gelu whose producer is such a linear and whose only reader is a linear may have its
//   gradient computed by that reader's dgrad (LinearLayer::fuse_input): the reader writes
//   dz = dy·gelu'(z) where dy lies, and this op's backward only moves it to dx when the gradient
//   plan gave dx other memory. It then declares passes_gradient_through, so that the plan gives its
//   input's gradient the memory of its output's and nothing moves. Unfused (the non-finite
//   replay), its backward computes dz from dy in place, as activation_backward allows.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "mixtrain/core/graph/layer.h"

namespace mixtrain::core {

class LinearLayer;

class ActivationLayer final : public Layer {
 public:
  ActivationLayer(std::string name, sdk::Activation act, std::int64_t features);
  std::vector<BackendNeed> backend_needs(sdk::DType input) const override;
  sdk::Activation activation() const { return act_; }
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;

 private:
  friend class LinearLayer;  // sets the fields below when it takes over the forward or backward
  sdk::Activation act_;
  bool fused_ = false;
  LinearLayer* producer_ = nullptr;     // the linear that runs this activation as its epilogue
  LinearLayer* grad_reader_ = nullptr;  // the linear whose dgrad computes this gradient
  // Whether grad_reader_'s dgrad computes this op's gradient in the backward that comes next.
  bool gradient_in_reader() const;
};

}  // namespace mixtrain::core
