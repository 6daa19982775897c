#include "graph/ops/activation.h"

#include "graph/ops/linear.h"
#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"

namespace mixtrain::core {

using ops::storage_of;
using sdk::DType;
using sdk::TensorView;

ActivationLayer::ActivationLayer(std::string name, sdk::Activation act, std::int64_t features)
    : Layer(std::move(name), act == sdk::Activation::relu ? "relu" : "gelu", features, features),
      act_(act) {
  // relu's backward reads its output when fused (see linear.h); counted whether fused or not,
  // since the replay of a skipped step switches fusion off and on.
  traits_.backward_reads_output = act_ == sdk::Activation::relu;
}

std::vector<BackendNeed> ActivationLayer::backend_needs(DType input) const {
  const DType y = storage_of(precision_.activation);
  return {
      {sdk::ActivationOp::activation_forward, {input, y}},
      {sdk::ActivationOp::activation_backward, {input, y, storage_of(precision_.activation_grad)}}};
}

void ActivationLayer::forward(TensorView x, std::int64_t rows) {
  if (fused_) return;  // the Linear before it wrote act(z) here as its GEMM epilogue
  facets().call(sdk::ActivationOp::activation_forward)->activation_forward(act_, x, output(rows));
}

bool ActivationLayer::gradient_in_reader() const {
  return grad_reader_ != nullptr && grad_reader_->input_gradient_done_;
}

void ActivationLayer::set_gradient_through(bool for_reader, bool for_producer) {
  through_for_reader_ = for_reader;
  through_for_producer_ = for_producer;
  traits_.passes_gradient_through = through_for_reader_ || through_for_producer_;
}

void ActivationLayer::backward(TensorView x, TensorView dy, TensorView dx, std::int64_t rows) {
  gradient_in_producer_ = false;
  if (dx.empty()) return;
  if (gradient_in_reader()) {
    // The reader's dgrad wrote dz where dy lies: the plan usually made that dx's memory too.
    ops::copy_as(*backend_, dy, dx);
    return;
  }
  if (fused_ && producer_ != nullptr && dx.dtype == dy.dtype &&
      producer_->casts_gelu_gradient(dy.dtype)) {
    // The producer's cast computes dz from dy where dx lies (the plan usually made it dy's memory).
    gradient_in_producer_ = true;
    if (dx.data != dy.data) backend_->copy(dx, dy);
    return;
  }
  // Fused relu: z was not stored; relu'(z) = [z > 0] = [relu(z) > 0], so the output serves.
  const TensorView in = fused_ && act_ == sdk::Activation::relu ? output(rows) : x;
  facets().call(sdk::ActivationOp::activation_backward)->activation_backward(act_, in, dy, dx);
}

// --- Definitions ---------------------------------------------------------------------------------

namespace {
template <sdk::Activation kAct>
BuiltOp build_activation(const OpNode& node) {
  return {std::make_unique<ActivationLayer>(node.name, kAct, node.inputs[0].back()),
          node.inputs[0]};
}
}  // namespace

OpDefinition relu_op() {
  OpDefinition op;
  op.type = "relu";
  op.keeps_layout = true;
  op.summary = "max(x, 0), element-wise";
  op.build = build_activation<sdk::Activation::relu>;
  return op;
}

OpDefinition gelu_op() {
  OpDefinition op;
  op.type = "gelu";
  op.keeps_layout = true;
  op.summary = "gelu(x), tanh approximation, element-wise";
  // Its backward reads its input (relu's, fused, reads its output: not recomputable).
  op.recomputable = true;
  op.build = build_activation<sdk::Activation::gelu>;
  return op;
}

}  // namespace mixtrain::core
