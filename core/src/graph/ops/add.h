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
// dy, masked where y is not positive when the relu is in (relu'(s) = [s > 0] = [y > 0]), all
// written from one read of dy where the backend's residual facet has add_backward (1.1), else
// one activation_backward (or copy, or cast) per input.
// BN + add + ReLU: a two-input add takes in a batch norm input that it alone reads (fuse_input);
// while that pair is fused (the batch norm's Layer::fused()) the forward is its
// forward_with_residual, with the other input as the residual, and nothing else changes.
// Add + layer norm: a two-input add without relu takes in one layer norm among its readers
// (fuse_one_reader); while that pair is fused the forward is the layer norm's forward_with_sum,
// which writes this op's output as well, and nothing else changes.
// A sum of linears (LoRA's base plus its B adapter): a two-input add without relu whose inputs
// are both linears that it alone reads takes them in (fuse_input), unless a layer norm reading
// it would be taken in instead. Where both allow it and write y's dtype (choose_kernels), the
// forward runs their GEMMs into y, the first writing it and the second adding to it (beta 1):
// neither output exists, and no pass of the add runs. In 16-bit the sum is then rounded twice
// (the first GEMM's output, then the sum) where the unfused ops round three times. Their
// gradients are dy itself, from the one buffer the memory plan lends both (memory_plan.h).
// train --profile files each GEMM under its linear's node, as if it had run at its own step.
class BatchNorm2dLayer;
class LayerNormLayer;
class LinearLayer;

class AddLayer final : public Layer {
 public:
  AddLayer(std::string name, std::size_t inputs, std::int64_t features);
  std::vector<BackendNeed> backend_needs(sdk::DType input) const override;
  bool take_relu() override;
  bool fuse_input(std::size_t k, Layer& input) override;
  bool fuse_one_reader(Layer& reader) override;
  // The sum of linears' verdict, given to both (after their own choose_kernels).
  void choose_kernels(sdk::DeviceBackend& backend) override;
  bool relu() const { return relu_; }
  // Not with a batch norm or a layer norm in its pass, whose outputs it writes too.
  bool forward_writes_only_its_output() const override;
  // A sum of linears whose linears both recompute their outputs (model.recompute's "linear"):
  // LoRA's adapted linear is recomputed whole, its GEMMs run again into y.
  bool recomputed_with_its_inputs() const override;
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;
  void forward_inputs(std::span<const sdk::TensorView> xs, std::int64_t rows) override;
  void backward_inputs(std::span<const sdk::TensorView> xs, sdk::TensorView dy,
                       std::span<const sdk::TensorView> dxs, std::int64_t rows) override;

 private:
  // The pre-fusion path: an FP32 sum of axpys (and the relu in place).
  void forward_by_axpy(std::span<const sdk::TensorView> xs, sdk::TensorView y, std::int64_t rows);

  // The backward's gradients from one read of dy (the residual facet's add_backward), when the
  // backend has it for these dtypes; false: the caller writes them one by one.
  bool backward_in_one_pass(sdk::TensorView dy, sdk::TensorView y,
                            std::span<const sdk::TensorView> dxs);

  std::size_t inputs_;
  bool relu_ = false;
  BatchNorm2dLayer* bn_ = nullptr;  // a batch norm input it runs in its pass (fuse_input)
  std::size_t bn_input_ = 0;        // which input bn_ is
  LayerNormLayer* ln_ = nullptr;    // a layer norm reading it that it runs in its pass
  LinearLayer* linears_[2] = {nullptr, nullptr};  // the sum of linears' inputs, by position
  bool sum_of_linears() const { return linears_[0] != nullptr && linears_[1] != nullptr; }
  int one_pass_ = -1;  // whether the backend has add for these dtypes (asked at the first call)
  Tensor sum_;         // fp32 [max_rows, features] when y is not fp32 and the backend has no add
};

}  // namespace mixtrain::core
