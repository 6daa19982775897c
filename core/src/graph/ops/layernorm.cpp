#include "graph/ops/layernorm.h"

#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"
#include "mixtrain/core/graph/backend_needs.h"

namespace mixtrain::core {

using ops::prefix;
using sdk::DType;
using sdk::TensorView;

LayerNormLayer::LayerNormLayer(std::string name, std::int64_t features, float eps)
    : Layer(std::move(name), "layernorm", features, features), eps_(eps) {
  traits_.precision_sensitive = true;
  // mean, variance, normalise, scale, shift: about five per element
  traits_.forward_flops_per_row = 5 * out_;
  traits_.parameters = {{"weight", {in_}}, {"bias", {in_}}};
}

void LayerNormLayer::allocate(const std::shared_ptr<sdk::DeviceBackend>& backend,
                              std::int64_t max_rows) {
  Layer::allocate(backend, max_rows);
  params_.clear();
  params_.push_back(make_parameter("weight", sdk::Shape{in_}, false));
  params_.push_back(make_parameter("bias", sdk::Shape{in_}, false));
  mean_ = Tensor(backend, DType::fp32, sdk::Shape{max_rows});
  rstd_ = Tensor(backend, DType::fp32, sdk::Shape{max_rows});
}

void LayerNormLayer::init_parameters(std::uint64_t) {
  backend_->fill(params_[0].master.view(), 1.0f);
  backend_->fill(params_[1].master.view(), 0.0f);
}

std::vector<BackendNeed> LayerNormLayer::backend_needs(DType input) const {
  return {{sdk::LayerNormOp::layernorm_forward, {input}},
          {sdk::LayerNormOp::layernorm_backward, {input}}};
}

void LayerNormLayer::forward(TensorView x, std::int64_t rows) {
  facets()
      .call(sdk::LayerNormOp::layernorm_forward)
      ->layernorm_forward(x, params_[0].master.view(), params_[1].master.view(), eps_, output(rows),
                          prefix(mean_, rows), prefix(rstd_, rows));
}

void LayerNormLayer::backward(TensorView x, TensorView dy, TensorView dx, std::int64_t rows) {
  Tensor unused;
  TensorView dx_target = dx;
  if (dx.empty()) {  // first layer: the input gradient is not needed but the kernel writes one
    unused = Tensor(backend_, DType::fp32, sdk::Shape{rows, in_});
    dx_target = unused.view();
  }
  // weight and bias are written together, so they start a step together; a frozen one's
  // gradient is left out (an empty view), and the facet skips its sum.
  ModelParameter &gamma = params_[0], &beta = params_[1];
  bool accumulate = false;
  for (ModelParameter* p : {&gamma, &beta})
    if (!p->frozen) accumulate = p->take_grad_beta() != 0.0f;
  const TensorView dgamma = gamma.frozen ? TensorView{} : gamma.grad.view();
  const TensorView dbeta = beta.frozen ? TensorView{} : beta.grad.view();
  if (accumulate_input_gradient(0) && !dx.empty()) {
    facets()
        .call(sdk::LayerNormOp::layernorm_backward_accumulate)
        ->layernorm_backward_accumulate(dy, x, gamma.master.view(), prefix(mean_, rows),
                                        prefix(rstd_, rows), dx, dgamma, dbeta, accumulate);
    return;
  }
  facets()
      .call(sdk::LayerNormOp::layernorm_backward)
      ->layernorm_backward(dy, x, gamma.master.view(), prefix(mean_, rows), prefix(rstd_, rows),
                           dx_target, dgamma, dbeta, accumulate);
}

void LayerNormLayer::choose_kernels(sdk::DeviceBackend& backend) {
  // Asked for every storage dtype its input may have: the plan gives the input's dtype to
  // backend_needs(), not here.
  accumulate_offered_ = true;
  for (DType t : {DType::fp32, DType::bf16, DType::fp16})
    if (unmet(backend, {sdk::LayerNormOp::layernorm_backward_accumulate, {t}}))
      accumulate_offered_ = false;
}

// --- Definition ----------------------------------------------------------------------------------

OpDefinition layernorm_op() {
  OpDefinition op;
  op.type = "layernorm";
  op.summary = "normalise the last dimension, then scale and shift (FP32 statistics)";
  op.has_parameters = true;
  op.schema = [] {
    return sdk::OptionSchema{
        sdk::OptionSpec::number("eps", 1e-5, "added to the variance").greater_than(0.0)};
  };
  op.build = [](const OpNode& node) {
    const auto& in = node.inputs;
    return BuiltOp{std::make_unique<LayerNormLayer>(
                       node.name, in[0].back(), static_cast<float>(node.options.get_double("eps"))),
                   in[0]};
  };
  return op;
}

}  // namespace mixtrain::core
