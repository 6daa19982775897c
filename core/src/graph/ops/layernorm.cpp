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
  traits_.output_may_take_readers_gemm_dtype = true;
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

void LayerNormLayer::log_add_unfused_once(const std::string& why) const {
  ops::log_once("layernorm", why,
                "add + layer norm runs unfused (node '" + name() +
                    "' and the nodes like it read the add's sum back): the backend " + why);
}

void LayerNormLayer::set_fusion(bool on) {
  fusion_on_ = on;
  update_fusion();
}

void LayerNormLayer::defer_into_input() {
  into_input_ = true;
  update_fusion();
}

void LayerNormLayer::update_fusion() {
  epilogue_fused_ = into_input_ && fusion_on_ && add_offered_;
  traits_.output_written_by_input = epilogue_fused_;
  if (!epilogue_fused_) written_by_add_ = false;
}

bool LayerNormLayer::forward_with_sum(TensorView a, TensorView b, TensorView sum,
                                      std::int64_t rows) {
  written_by_add_ = false;  // a pass that falls back must not skip this op's forward
  if (!fused()) return false;
  const TensorView y = output(rows);
  const BackendNeed need{sdk::LayerNormOp::layernorm_add_forward,
                         {a.dtype, b.dtype, sum.dtype, y.dtype}};
  if (const std::optional<std::string> why = unmet(*backend_, need)) {
    log_add_unfused_once(*why);
    return false;
  }
  sdk::LayerNormAddArgs args;
  args.a = a;
  args.b = b;
  args.sum = sum;
  args.gamma = params_[0].master.view();
  args.beta = params_[1].master.view();
  args.eps = eps_;
  args.y = y;
  args.mean = prefix(mean_, rows);
  args.rstd = prefix(rstd_, rows);
  facets().call(sdk::LayerNormOp::layernorm_add_forward)->layernorm_add_forward(args);
  written_by_add_ = true;
  return true;
}

void LayerNormLayer::forward(TensorView x, std::int64_t rows) {
  if (written_by_add_) {  // the add before it ran it (forward_with_sum)
    written_by_add_ = false;
    return;
  }
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
  // Add + layer norm: asked for a residual stream of each dtype into this op's output dtype; the
  // forward asks again for the dtypes it meets (forward_with_sum).
  if (into_input_) {
    const DType y = ops::storage_of(precision_.activation);
    std::optional<std::string> why;
    for (DType t : {DType::fp32, DType::bf16, DType::fp16})
      if (!why) why = unmet(backend, {sdk::LayerNormOp::layernorm_add_forward, {t, t, t, y}});
    add_offered_ = !why.has_value();
    if (why && fusion_on_) log_add_unfused_once(*why);
    update_fusion();
  }
}

// --- Definition ----------------------------------------------------------------------------------

OpDefinition layernorm_op() {
  OpDefinition op;
  op.type = "layernorm";
  op.summary = "normalise the last dimension, then scale and shift (FP32 statistics)";
  op.has_parameters = true;
  // Its backward reads its input and the statistics; a second forward writes the same ones.
  op.recomputable = true;
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
