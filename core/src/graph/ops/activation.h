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
// - A gelu that an FP8 linear runs as its epilogue may instead have its gradient computed by that
//   producer's cast of its output gradient (LinearLayer::casts_gelu_gradient, gemm facet 1.7's
//   cast_transpose_gradient): this op's backward then only moves dy to dx where the plan gave dx
//   other memory (passes_gradient_through again), and the producer's backward reads dy there
//   with z and casts dz = dy·gelu'(z), rounded into dy's dtype as this op would have.
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
  // Whether producer_'s backward computes this op's gradient in its cast: set by the last backward.
  bool gradient_in_producer_ = false;
  // passes_gradient_through, asked by the reader's fusion or the producer's.
  bool through_for_reader_ = false, through_for_producer_ = false;
  void set_gradient_through(bool for_reader, bool for_producer);
};

}  // namespace mixtrain::core
