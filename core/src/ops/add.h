// add: the residual join of two or more tensors of one shape.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "mixtrain/core/layer.h"

namespace mixtrain::core {

// y = x1 + x2 + ... (a residual join): the sum in FP32, rounded once into y's dtype; each input's
// gradient is dy.
class AddLayer final : public Layer {
 public:
  AddLayer(std::string name, std::size_t inputs, std::int64_t features);
  std::vector<BackendNeed> backend_needs(sdk::DType input) const override;
  std::size_t input_count() const override { return inputs_; }
  bool backward_reads_inputs() const override { return false; }  // each input's gradient is dy
  bool passes_gradient_through() const override { return true; }
  std::int64_t forward_flops_per_row() const override {
    return static_cast<std::int64_t>(inputs_ - 1) * out_;
  }
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;
  void forward_inputs(std::span<const sdk::TensorView> xs, std::int64_t rows) override;
  void backward_inputs(std::span<const sdk::TensorView> xs, sdk::TensorView dy,
                       std::span<const sdk::TensorView> dxs, std::int64_t rows) override;

 private:
  std::size_t inputs_;
  Tensor sum_;  // fp32 [max_rows, features] when y is not fp32
};

}  // namespace mixtrain::core
