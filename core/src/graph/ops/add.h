// add: the residual join of two or more tensors of one shape.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "mixtrain/core/graph/layer.h"

namespace mixtrain::core {

// y = x1 + x2 + ... (a residual join), then max(0, ·) when the relu that is its only reader was
// taken in (take_relu; the relu node becomes a view of y, as after batch norm). The sum is FP32,
// rounded once into y's dtype: one pass through the backend's add where it has one, else a
// copy (or cast) into an FP32 sum, axpys, a cast and an in-place relu. Each input's gradient is
// dy, masked where y is not positive when the relu is in (relu'(s) = [s > 0] = [y > 0]).
class AddLayer final : public Layer {
 public:
  AddLayer(std::string name, std::size_t inputs, std::int64_t features);
  std::vector<BackendNeed> backend_needs(sdk::DType input) const override;
  bool take_relu() override;
  bool relu() const { return relu_; }
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;
  void forward_inputs(std::span<const sdk::TensorView> xs, std::int64_t rows) override;
  void backward_inputs(std::span<const sdk::TensorView> xs, sdk::TensorView dy,
                       std::span<const sdk::TensorView> dxs, std::int64_t rows) override;

 private:
  // The pre-fusion path: an FP32 sum of axpys (and the relu in place).
  void forward_by_axpy(std::span<const sdk::TensorView> xs, sdk::TensorView y, std::int64_t rows);

  std::size_t inputs_;
  bool relu_ = false;
  int one_pass_ = -1;  // whether the backend has add for these dtypes (asked at the first call)
  Tensor sum_;         // fp32 [max_rows, features] when y is not fp32 and the backend has no add
};

}  // namespace mixtrain::core
