#include "graph/ops/dropout.h"

#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"
#include "mixtrain/core/graph/random.h"

namespace mixtrain::core {

using ops::storage_of;
using sdk::DType;
using sdk::TensorView;

namespace {
std::uint64_t node_seed(std::uint64_t run_seed, const std::string& node) {
  return derive_seed(run_seed, (node + ".dropout").c_str());
}
}  // namespace

DropoutLayer::DropoutLayer(std::string name, std::int64_t features, float p)
    : Layer(std::move(name), "dropout", features, features), p_(p), seed_(node_seed(0, name_)) {
  // The mask comes from the key, so backward needs only dy.
  traits_.backward_reads_inputs = false;
  // The key holds the step and micro-batch (key()), so a step graph cannot replay it.
  traits_.varies_per_step = p_ > 0.0f;
}

sdk::DropoutKey DropoutLayer::key() const {
  return {seed_, (static_cast<std::uint64_t>(step()) << 32) | static_cast<std::uint32_t>(draw())};
}

void DropoutLayer::init_parameters(std::uint64_t seed) {
  seed_ = node_seed(seed, name_);
}

std::vector<BackendNeed> DropoutLayer::backend_needs(DType input) const {
  if (p_ == 0.0f) return {};  // never calls the facet
  const DType grad = storage_of(precision_.activation_grad);
  return {{sdk::DropoutOp::dropout_forward, {input, storage_of(precision_.activation)}},
          {sdk::DropoutOp::dropout_backward, {grad, grad}}};
}

void DropoutLayer::pass_through(TensorView from, TensorView to) {
  if (storage_of(from.dtype) == storage_of(to.dtype))
    backend_->copy(to, from);
  else
    backend_->cast(from, to);
}

void DropoutLayer::forward(TensorView x, std::int64_t rows) {
  const TensorView y = output(rows);
  if (!training() || p_ == 0.0f) {
    pass_through(x, y);
    return;
  }
  facets().call(sdk::DropoutOp::dropout_forward)->dropout_forward(x, y, p_, key());
}

void DropoutLayer::backward(TensorView, TensorView dy, TensorView dx, std::int64_t) {
  if (dx.empty()) return;
  if (!training() || p_ == 0.0f) {
    pass_through(dy, dx);
    return;
  }
  facets().call(sdk::DropoutOp::dropout_backward)->dropout_backward(dy, dx, p_, key());
}

// --- Definition ----------------------------------------------------------------------------------

OpDefinition dropout_op() {
  OpDefinition op;
  op.type = "dropout";
  op.keeps_layout = true;
  op.summary = "x · mask / (1 - p) in training (torch.nn.Dropout), x in evaluation";
  op.schema = [] {
    return sdk::OptionSchema{
        sdk::OptionSpec::number("p", 0.5, "probability of zeroing an element, in [0, 1)")
            .at_least(0.0)
            .at_most(1.0)};
  };
  op.build = [](const OpNode& node) {
    const double p = node.options.get_double("p");
    if (p >= 1.0)
      throw OpSpecError("p", "p = 1 would zero every element, and scale by 1 / (1 - p) = inf",
                        "use a p below 1 (torch's default is 0.5), or remove the node");
    return BuiltOp{
        std::make_unique<DropoutLayer>(node.name, node.inputs[0].back(), static_cast<float>(p)),
        node.inputs[0]};
  };
  return op;
}

}  // namespace mixtrain::core
