#include "graph/ops/add.h"

#include <algorithm>
#include <vector>

#include "graph/ops/batchnorm2d.h"
#include "graph/ops/layernorm.h"
#include "graph/ops/linear.h"
#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"

namespace mixtrain::core {

using sdk::DType;
using sdk::TensorView;

AddLayer::AddLayer(std::string name, std::size_t inputs, std::int64_t features)
    : Layer(std::move(name), "add", features, features), inputs_(inputs) {
  traits_.inputs = inputs;
  traits_.backward_reads_inputs = false;  // each input's gradient is dy
  traits_.passes_gradient_through = true;
  traits_.forward_flops_per_row = static_cast<std::int64_t>(inputs - 1) * out_;
}

bool AddLayer::take_relu() {
  relu_ = true;
  traits_.backward_reads_output = true;  // the ReLU's mask
  return true;
}

bool AddLayer::fuse_input(std::size_t k, Layer& input) {
  if (auto* linear = dynamic_cast<LinearLayer*>(&input)) {
    if (inputs_ != 2 || relu_ || bn_ != nullptr || k > 1 || linears_[k] != nullptr) return false;
    linears_[k] = linear;
    if (!sum_of_linears()) return true;
    // Unfused (the replay), the first writes into y and the add adds the second in place.
    linears_[0]->defer_into_reader(true);
    linears_[1]->defer_into_reader(false);
    return true;
  }
  auto* bn = dynamic_cast<BatchNorm2dLayer*>(&input);
  if (bn_ != nullptr || inputs_ != 2 || bn == nullptr || !bn->defer_into_reader()) return false;
  bn_ = bn;
  bn_input_ = k;
  return true;
}

bool AddLayer::forward_writes_only_its_output() const {
  return bn_ == nullptr && ln_ == nullptr;
}

bool AddLayer::recomputed_with_its_inputs() const {
  return sum_of_linears() && linears_[0]->recomputes_output() && linears_[1]->recomputes_output();
}

bool AddLayer::fuse_one_reader(Layer& reader) {
  auto* ln = dynamic_cast<LayerNormLayer*>(&reader);
  if (ln_ != nullptr || bn_ != nullptr || relu_ || inputs_ != 2 || ln == nullptr ||
      sum_of_linears())
    return false;
  ln->defer_into_input();
  ln_ = ln;
  return true;
}

void AddLayer::choose_kernels(sdk::DeviceBackend&) {
  if (!sum_of_linears()) return;
  const DType y = ops::storage_of(precision_.activation);
  bool allowed = !relu_ && ln_ == nullptr;
  for (const LinearLayer* linear : linears_)
    allowed = allowed && linear->can_run_in_reader() &&
              ops::storage_of(linear->precision().activation) == y;
  for (LinearLayer* linear : linears_) linear->allow_run_in_reader(allowed);
}

std::vector<BackendNeed> AddLayer::backend_needs(DType input) const {
  // The backend's residual facet is optional (forward_inputs asks for it); the axpy path is the
  // baseline.
  std::vector<BackendNeed> needs = {{sdk::ActivationOp::axpy, {input, DType::fp32}}};
  if (relu_) {
    const DType y = ops::storage_of(precision_.activation);
    const DType grad = ops::storage_of(precision_.activation_grad);
    needs.push_back({sdk::ActivationOp::activation_forward, {y, y}});
    needs.push_back({sdk::ActivationOp::activation_backward, {y, grad, grad}});
  }
  return needs;
}

void AddLayer::forward(TensorView x, std::int64_t rows) {
  const TensorView xs[1] = {x};
  forward_inputs(xs, rows);
}

void AddLayer::backward(TensorView x, TensorView dy, TensorView dx, std::int64_t rows) {
  const TensorView xs[1] = {x}, dxs[1] = {dx};
  backward_inputs(xs, dy, dxs, rows);
}

void AddLayer::forward_inputs(std::span<const TensorView> xs, std::int64_t rows) {
  // x is [rows, features] per input.
  const TensorView y = output(rows);
  if (sum_of_linears() && linears_[0]->runs_in_reader()) {
    // y = x0·W0ᵀ + b0, then y += x1·W1ᵀ + b1: the sum of linears (fuse_input).
    linears_[0]->forward_into(y, 0.0f);
    linears_[1]->forward_into(y, 1.0f);
    return;
  }
  if (ln_ != nullptr && ln_->forward_with_sum(xs[0], xs[1], y, rows)) return;
  std::vector<TensorView> read;
  if (bn_ != nullptr && bn_->fused()) {
    if (bn_->forward_with_residual(xs[1 - bn_input_], relu_, y, rows)) return;
    read.assign(xs.begin(), xs.end());
    // It wrote its own output instead: read it from there.
    const TensorView out = bn_->output(rows);
    read[bn_input_] = {out.data, xs[bn_input_].dtype, xs[bn_input_].shape};
    xs = read;
  }
  // An input in y's memory (batch norm's unfused output, memory_plan.h's output_home) goes first:
  // the axpy path starts its sum by copying input 1 into y. Two terms commute exactly.
  if (xs.size() == 2 && xs[1].data == y.data) {
    if (read.empty()) read.assign(xs.begin(), xs.end());
    std::swap(read[0], read[1]);
    xs = read;
  }
  if (one_pass_ < 0) {
    const sdk::ResidualFacet* residual = facets().find<sdk::ResidualFacet>();
    one_pass_ = residual != nullptr ? 1 : 0;
    for (const TensorView& x : xs)
      if (one_pass_ == 1 &&
          !residual->supports(sdk::ResidualOp::add, std::vector<DType>{x.dtype, y.dtype}))
        one_pass_ = 0;
  }
  if (one_pass_ == 1)
    facets().call(sdk::ResidualOp::add)->add(xs, relu_, y);
  else
    forward_by_axpy(xs, y, rows);
}

void AddLayer::forward_by_axpy(std::span<const TensorView> xs, TensorView y, std::int64_t rows) {
  TensorView acc = y;
  if (y.dtype != DType::fp32) {
    if (sum_.empty()) sum_ = Tensor(backend_, DType::fp32, sdk::Shape{max_rows_, out_});
    acc = sum_.rows(rows);
  }
  // Input 1 may be y itself (fp32): the sum then starts there.
  if (xs[0].data != acc.data) {
    if (xs[0].dtype == DType::fp32)
      backend_->copy(acc, xs[0]);
    else
      backend_->cast(xs[0], acc);
  }
  for (std::size_t i = 1; i < xs.size(); ++i)
    facets().call(sdk::ActivationOp::axpy)->axpy(1.0f, xs[i], acc);
  if (acc.data != y.data) backend_->cast(acc, y);
  if (relu_)
    facets()
        .call(sdk::ActivationOp::activation_forward)
        ->activation_forward(sdk::Activation::relu, y, y);
}

bool AddLayer::backward_in_one_pass(TensorView dy, TensorView y, std::span<const TensorView> dxs) {
  const sdk::ResidualFacet* residual = facets().find<sdk::ResidualFacet>();
  if (residual == nullptr || residual->version() < sdk::FacetVersion{1, 1}) return false;
  std::vector<TensorView> write;
  for (const TensorView& dx : dxs) {
    // Without the relu an input whose gradient is dy's memory is already written; with it, two
    // inputs lent that memory are masked in it once.
    const bool aliased = dx.data == dy.data && dx.dtype == dy.dtype;
    const bool again = aliased && std::any_of(write.begin(), write.end(), [&](const TensorView& w) {
                         return w.data == dx.data;
                       });
    const bool done = (!relu_ && aliased) || again;
    if (dx.empty() || done) {
      write.emplace_back();
      continue;
    }
    if (!residual->supports(sdk::ResidualOp::add_backward, std::vector<DType>{dy.dtype, dx.dtype}))
      return false;
    write.push_back(dx);
  }
  if (std::all_of(write.begin(), write.end(), [](const TensorView& v) { return v.empty(); }))
    return true;
  facets()
      .call(sdk::ResidualOp::add_backward)
      ->add_backward(dy, relu_ ? y : TensorView{}, relu_, write);
  return true;
}

void AddLayer::backward_inputs(std::span<const TensorView>, TensorView dy,
                               std::span<const TensorView> dxs, std::int64_t rows) {
  if (backward_in_one_pass(dy, output(rows), dxs)) return;
  // An input whose gradient the model placed at dy's address (same dtype) is written last: with
  // the relu in, its masking in place must not come before the others read dy.
  const TensorView* aliased = nullptr;
  for (const TensorView& dx : dxs) {
    if (dx.empty()) continue;
    if (dx.data == dy.data && dx.dtype == dy.dtype) {
      aliased = &dx;
      continue;
    }
    if (relu_)
      facets()
          .call(sdk::ActivationOp::activation_backward)
          ->activation_backward(sdk::Activation::relu, output(rows), dy, dx);
    else
      ops::copy_as(*backend_, dy, dx);
  }
  if (aliased != nullptr && relu_)
    facets()
        .call(sdk::ActivationOp::activation_backward)
        ->activation_backward(sdk::Activation::relu, output(rows), dy, dy);
}

// --- Definition ----------------------------------------------------------------------------------

OpDefinition add_op() {
  OpDefinition op;
  op.type = "add";
  op.keeps_layout = true;
  op.summary =
      "x1 + x2 + ...: the residual join (FP32 sum, one rounding; takes in a relu reading it)";
  op.min_inputs = 2;
  op.max_inputs = 0;
  op.build = [](const OpNode& node) {
    const auto& in = node.inputs;
    for (std::size_t k = 1; k < in.size(); ++k)
      if (in[k] != in[0])
        throw OpSpecError(
            "",
            "shape mismatch: input 1 is " + ops::shape_text(in[0]) + " per sample but input " +
                std::to_string(k + 1) + " is " + ops::shape_text(in[k]),
            "every input of add has the same shape; put a linear or reshape before it");
    return BuiltOp{std::make_unique<AddLayer>(node.name, in.size(), in[0].back()), in[0]};
  };
  return op;
}

}  // namespace mixtrain::core
